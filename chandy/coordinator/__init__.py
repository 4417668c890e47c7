"""Chandy's checkpoint coordination: state machine, event-sourced log, runtime, storage, hooks."""
