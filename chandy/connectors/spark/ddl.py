"""Spark SQL DDL schemas (``a INT, b STRUCT<c: STRING, d: ARRAY<DOUBLE>>``), parsed without a JVM.

PySpark parses DDL in the JVM (``DataType.fromDDL``), so a bad ``--value-schema`` would surface
only once Spark is up, as a Java stack trace. This parser covers the DDL a value schema uses:
comma-separated ``name type`` fields (names optionally in backticks, an optional ``NOT NULL`` and
``COMMENT '...'``), the primitive types, ``DECIMAL(p, s)``, ``CHAR(n)``/``VARCHAR(n)`` (as
string), ``ARRAY<t>``, ``MAP<k, v>`` and ``STRUCT<name: t, ...>`` (the colon is optional), as in
Spark's ``DataTypeParser``. Keywords are case-insensitive.
"""

from __future__ import annotations

import re

from pyspark.sql import types as T

from chandy.coordinator.errors import SuppressRestartsError


class DdlError(SuppressRestartsError):
    """A DDL schema that does not parse; the message gives the position and what was expected. The
    same text fails the same way on every attempt, so no restart cures it (Flink's
    ``SuppressRestartsException``): a micro-batch that fails with it fails the job."""


_PRIMITIVES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(), "tinyint": T.ByteType(), "byte": T.ByteType(), "smallint": T.ShortType(),
    "short": T.ShortType(), "int": T.IntegerType(), "integer": T.IntegerType(), "bigint": T.LongType(),
    "long": T.LongType(), "float": T.FloatType(), "real": T.FloatType(), "double": T.DoubleType(),
    "string": T.StringType(), "binary": T.BinaryType(), "date": T.DateType(), "timestamp": T.TimestampType(),
    "timestamp_ltz": T.TimestampType(), "timestamp_ntz": T.TimestampNTZType(),
}
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')|(\S))")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, value, position)
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                break
            kinds = ("quoted", "word", "number", "string", "symbol")
            for kind, value in zip(kinds, match.groups(), strict=True):
                if value is not None:
                    self.tokens.append((kind, value, match.start(match.lastindex or 0)))
            pos = match.end()
        self.i = 0

    def _fail(self, expected: str) -> DdlError:
        if self.i < len(self.tokens):
            kind, value, pos = self.tokens[self.i]
            found = f"{value!r} at position {pos}"
        else:
            found = "the end"
        return DdlError(f"invalid schema DDL {self.text!r}: expected {expected}, found {found}")

    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _symbol(self, symbol: str) -> bool:
        token = self._peek()
        if token is not None and token[0] == "symbol" and token[1] == symbol:
            self.i += 1
            return True
        return False

    def _expect(self, symbol: str) -> None:
        if not self._symbol(symbol):
            raise self._fail(repr(symbol))

    def _keyword(self, word: str) -> bool:
        token = self._peek()
        if token is not None and token[0] == "word" and token[1].lower() == word:
            self.i += 1
            return True
        return False

    def _name(self) -> str:
        token = self._peek()
        if token is None or token[0] not in ("word", "quoted"):
            raise self._fail("a field name")
        self.i += 1
        return token[1][1:-1].replace("``", "`") if token[0] == "quoted" else token[1]

    def _number(self) -> int:
        token = self._peek()
        if token is None or token[0] != "number":
            raise self._fail("a number")
        self.i += 1
        return int(token[1])

    def data_type(self) -> T.DataType:
        token = self._peek()
        if token is None or token[0] != "word":
            raise self._fail("a type")
        self.i += 1
        word = token[1].lower()
        if word == "array":
            self._expect("<")
            element = self.data_type()
            self._expect(">")
            return T.ArrayType(element)
        if word == "map":
            self._expect("<")
            key = self.data_type()
            self._expect(",")
            value = self.data_type()
            self._expect(">")
            return T.MapType(key, value)
        if word == "struct":
            self._expect("<")
            fields: list[T.StructField] = []
            if not self._symbol(">"):
                while True:
                    name = self._name()
                    self._symbol(":")
                    fields.append(self._field_rest(name))
                    if self._symbol(">"):
                        break
                    self._expect(",")
            return T.StructType(fields)
        if word in ("decimal", "dec", "numeric"):
            if self._symbol("("):
                precision = self._number()
                scale = self._number() if self._symbol(",") else 0
                self._expect(")")
                return T.DecimalType(precision, scale)
            return T.DecimalType(10, 0)
        if word in ("char", "varchar"):
            self._expect("(")
            self._number()
            self._expect(")")
            return T.StringType()
        if word in _PRIMITIVES:
            return _PRIMITIVES[word]
        self.i -= 1
        raise self._fail("a Spark SQL type (int, string, decimal(p, s), array<...>, map<...>, struct<...>, ...)")

    def _field_rest(self, name: str) -> T.StructField:
        data_type = self.data_type()
        nullable = True
        if self._keyword("not"):
            if not self._keyword("null"):
                raise self._fail("NULL after NOT")
            nullable = False
        metadata = {}
        if self._keyword("comment"):
            token = self._peek()
            if token is None or token[0] != "string":
                raise self._fail("a quoted comment")
            self.i += 1
            metadata["comment"] = token[1][1:-1]
        return T.StructField(name, data_type, nullable, metadata)

    def schema(self) -> T.StructType:
        fields = []
        while True:
            name = self._name()
            self._symbol(":")
            fields.append(self._field_rest(name))
            if self._peek() is None:
                break
            self._expect(",")
        names = [f.name.lower() for f in fields]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise DdlError(f"invalid schema DDL {self.text!r}: duplicate field(s) {', '.join(duplicates)}")
        return T.StructType(fields)


def parse_ddl(text: str) -> T.StructType:
    """The :class:`pyspark.sql.types.StructType` of a DDL field list (``STRUCT<...>`` around
    it is accepted too).

    Raises:
        DdlError: the text does not parse; the message names the position and what was expected.
    """
    stripped = (text or "").strip()
    if not stripped:
        raise DdlError("the schema DDL is empty")
    if re.match(r"(?i)struct\s*<", stripped) and stripped.endswith(">"):
        parser = _Parser(stripped)
        struct = parser.data_type()
        if parser._peek() is not None:
            raise parser._fail("the end")
        assert isinstance(struct, T.StructType)
        return struct
    return _Parser(stripped).schema()


def value_struct(schema_json: str) -> T.StructType:
    """An Avro value schema's fields as a Spark ``StructType``: spark-avro's
    ``SchemaConverters.toSqlType`` mapping (:func:`chandy.formats.avro.value_schema`'s Arrow
    columns, through pyspark's ``from_arrow_schema``).

    Raises:
        AvroValueSchemaError: not JSON, not a record, or a field of a type without a column type.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    from chandy.formats.avro import value_schema

    return from_arrow_schema(value_schema(schema_json))


def value_fields(schema_json: str) -> list[tuple[str, str]]:
    """(field name, Spark type as ``simpleString``) of an Avro value schema's fields.

    Raises:
        AvroValueSchemaError: see :func:`value_struct`.
    """
    return [(f.name, f.dataType.simpleString()) for f in value_struct(schema_json).fields]
