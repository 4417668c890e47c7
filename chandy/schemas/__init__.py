"""Chandy's wire contract: the Avro schemas (``chandy.v1.*.avsc``) and the one codec module.

Each ``.avsc`` file holds one named type, named ``<namespace>.<name>.avsc``; a schema refers to
another by its full name, and :func:`chandy.schemas.codec.load_schemas` (fastavro's ``load_schema``)
resolves the references from this directory. External consumers read the same files.
"""

from pathlib import Path

#: Directory of the ``.avsc`` files shipped with the package.
SCHEMA_DIR = Path(__file__).resolve().parent
#: Avro namespace of every Chandy schema.
NAMESPACE = "chandy.v1"
