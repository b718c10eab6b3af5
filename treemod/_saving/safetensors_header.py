"""The safetensors header, parsed by the rules of the reference implementation.

`parse_header` accepts the headers that the `safetensors` package (the Rust reference) accepts,
and rejects the rest with a `HeaderError` that says what is wrong: JSON as `serde_json` reads it
(no NaN, no numbers out of the float64 range, no lone surrogates, at most 127 levels of
nesting), a top-level object of tensor entries and an optional `__metadata__` map of strings,
each entry with a known `dtype`, a `shape` and two `data_offsets` that are unsigned 64-bit
integers, and tensors that, sorted by offsets, cover the data section exactly: no gaps, no
overlaps, each taking exactly the bytes its dtype and shape need. A name given twice keeps its
last entry, as in the reference.

Two forms that the reference's deserialiser also takes and no writer produces are refused: an
entry written as a JSON array `[dtype, shape, offsets]`, and a dtype written as `{"F32": null}`.
Beyond the reference, a header may hold at most `MAX_TENSORS` entries (counted while parsing,
so a huge header is rejected without building it), and a shape at most `MAX_NDIM` dimensions
(NumPy's limit: no array could hold such a tensor), and at most `MAX_STRINGS` strings and
`MAX_VALUES` other values (counted in the raw bytes before parsing, as each parsed value costs
memory; a header treemod writes holds far fewer). Values the reference ignores (unknown
fields) are still checked to be JSON it reads, in one pass over their containers; the checks for
strings and huge numbers run only when the raw header holds a surrogate escape or a long
run of digits, so a hostile 100 MB header is parsed at JSON speed.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, NamedTuple

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_NDIM",
    "MAX_STRINGS",
    "MAX_TENSORS",
    "MAX_VALUES",
    "Entry",
    "HeaderError",
    "parse_header",
]

MAX_HEADER_BYTES = 100_000_000  # the reference's limit
MAX_TENSORS = 100_000
MAX_NDIM = 64  # NumPy's most dimensions
# JSON values a header may hold: strings, and values of all kinds outside strings (counted by
# their separating commas). A tensor's entry needs about 5 strings and 4 + ndim commas.
MAX_STRINGS = 20 * MAX_TENSORS
MAX_VALUES = 50 * MAX_TENSORS
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# What the raw header must hold for a lone surrogate (a `\uD800`-`\uDFFF` escape: UTF-8 text
# cannot hold one) or a number beyond float64 (an integer of 309 digits, a mantissa of 200
# digits with an exponent of 2, or an exponent of 3 digits) to be possible.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Digits become "0", exponent letters "e", signs "+" (the rest " "): a number beyond float64
# shows as 200 "0"s in a row or an exponent of 3 digits ("e000", "e+000"), found at C speed.
_NUMBER_TABLE = bytes(
    b"0"[0] if c in b"0123456789" else b"e"[0] if c in b"eE" else b"+"[0] if c in b"+-" else 32
    for c in range(256)
)
_MAX_DEPTH = 127  # serde_json's recursion limit: 127 nested arrays/objects are accepted
_U64 = 2**64 - 1
_F64_MAX = int(sys.float_info.max)
_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
_FIELDS = ("dtype", "shape", "data_offsets")


class HeaderError(Exception):
    """What is wrong with a header (the reader adds the file's name)."""


class Entry(NamedTuple):
    """One tensor's header entry, validated."""

    code: str
    shape: tuple[int, ...]
    begin: int
    end: int


class _Object(dict[str, Any]):
    """A JSON object; `pairs` keeps every key/value pair when a key repeats."""

    pairs: list[tuple[str, Any]] | None = None


class _TooMany(Exception):
    pass


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise HeaderError(f"its header holds the number {text[:40]}, out of the float64 range")
    return value


def _int(text: str) -> int | float:
    """An integer as serde_json reads it: beyond u64/i64 (and -0) it is a float."""
    if len(text) < 19 and text != "-0":  # the common case: within i64 whatever its sign
        return int(text)
    negative = text[0] == "-"
    if len(text) - negative > 20 or text == "-0":
        return _float(text)
    value = int(text)
    return value if -(2**63) <= value <= _U64 else _float(text)


def _constant(text: str) -> Any:
    raise HeaderError(f"its header holds {text}, which JSON does not allow")


def _check_text(text: str, what: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise HeaderError(f"{what} {text!r} holds a lone surrogate (invalid Unicode)") from None


class _Free:
    """Checks that values the reference ignores are JSON it reads (see the module docstring).

    `texts`/`numbers`: whether the raw header could hold a lone surrogate or a number beyond
    float64; without them only the nesting depth is checked. Both are found on first use: a
    header with no unknown fields (every writer's) never needs them.
    """

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.texts = self.numbers = True

    def _scan(self) -> None:
        raw, self.raw = self.raw, b""
        if raw:
            self.texts = b"\\u" in raw and _SURROGATE_ESCAPE.search(raw) is not None
            shapes = raw.translate(_NUMBER_TABLE)
            self.numbers = b"0" * 200 in shapes or b"e000" in shapes or b"e+000" in shapes

    def check(self, value: Any, depth: int, where: str) -> None:
        """Raise a `HeaderError` if `value` (found `depth` levels deep) is not readable."""
        self._scan()
        stack = [(value, depth)]
        while stack:
            value, depth = stack.pop()
            if isinstance(value, dict):
                if self.texts:
                    for key in value:
                        _check_text(key, f"{where}: the key")
                items: Any = value.values()
            elif isinstance(value, list):
                items = value
            else:
                self._scalars([value], {type(value)}, where)
                continue
            if depth > _MAX_DEPTH:
                raise HeaderError(f"{where} is nested more than {_MAX_DEPTH} levels deep")
            kinds = set(map(type, items))
            self._scalars(items, kinds, where)
            if list in kinds or dict in kinds or _Object in kinds:
                if depth + 1 > _MAX_DEPTH:
                    raise HeaderError(f"{where} is nested more than {_MAX_DEPTH} levels deep")
                # Empty ones need nothing more (their depth was just checked).
                stack.extend((v, depth + 1) for v in items if v and isinstance(v, list | dict))

    def _scalars(self, items: Any, kinds: set[type], where: str) -> None:
        if self.texts and str in kinds:
            for item in items:
                if type(item) is str:
                    _check_text(item, f"{where}: the string")
        if self.numbers and int in kinds:
            for item in items:  # serde reads an integer beyond u64 as a float
                if type(item) is int and not -_F64_MAX <= item <= _F64_MAX:
                    raise HeaderError(f"{where} holds an integer out of the float64 range")


def _too_many() -> str:
    return (
        f"its header has more than {MAX_TENSORS:,} entries, more than a checkpoint may hold "
        "(stack many small arrays into fewer large ones)"
    )


def _decode(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError(f"its header is not valid UTF-8 ({e})") from None
    count = 0

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal count
        count += 1
        if count > MAX_TENSORS + 2:
            raise _TooMany
        obj = dict(pairs)
        if len(obj) != len(pairs):  # a repeated key: keep every pair
            obj = _Object(pairs)
            obj.pairs = pairs
        return obj

    try:
        return json.loads(
            text,
            object_pairs_hook=hook,
            parse_int=_int if "-0" in text else None,  # "-0": the one divergence below u64
            parse_float=_float,
            parse_constant=_constant,
        )
    except _TooMany:
        raise HeaderError(_too_many()) from None
    except json.JSONDecodeError as e:
        raise HeaderError(f"its header is not valid JSON ({e})") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise HeaderError("its header holds a number out of the float64 range") from None
    except RecursionError:
        raise HeaderError(f"its header is nested more than {_MAX_DEPTH} levels deep") from None


def _usize(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _U64


def _sizes(value: Any) -> bool:
    """Whether `value` is a list of u64s."""
    if type(value) is not list:
        return False
    for d in value:
        if type(d) is not int or d < 0 or d > _U64:
            return False
    return True


def _entry(name: str, value: Any, free: _Free) -> Entry:
    if type(value) is dict and len(value) == 3:  # the common case: exactly the three fields
        code: Any = value.get("dtype")
        shape: Any = value.get("shape")
        offsets: Any = value.get("data_offsets")
        if (
            code.__class__ is str
            and code in _BITS
            and type(shape) is list
            and len(shape) <= MAX_NDIM
            and _sizes(shape)
            and _sizes(offsets)
            and len(offsets) == 2
        ):
            return Entry(code, tuple(shape), offsets[0], offsets[1])
    bad = f"the header entry of tensor {name!r}"
    if not isinstance(value, dict):
        raise HeaderError(f"{bad} is not an object (it is {type(value).__name__})")
    pairs = value.pairs if isinstance(value, _Object) and value.pairs else value.items()
    seen: set[str] = set()
    for key, item in pairs:
        if key in _FIELDS:
            if key in seen:
                raise HeaderError(f"{bad} gives {key!r} twice")
            seen.add(key)
        else:
            _check_text(key, f"{bad} has a field")
            free.check(item, 3, f"{bad}, field {key!r},")
    missing = [f for f in _FIELDS if f not in seen]
    if missing:
        raise HeaderError(f"{bad} has no {missing[0]!r}")
    code, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(code, str) or code not in _BITS:
        raise HeaderError(f"{bad} has an unknown dtype {code!r}")
    if isinstance(shape, list) and len(shape) > MAX_NDIM:
        raise HeaderError(
            f"{bad} has a shape of {len(shape):,} dimensions, more than an array can have "
            f"({MAX_NDIM})"
        )
    if not isinstance(shape, list) or not all(_usize(d) for d in shape):
        raise HeaderError(f"{bad} has an invalid shape {shape!r} (a list of sizes >= 0)")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_usize, offsets)):
        raise HeaderError(f"{bad} has invalid data_offsets {offsets!r} (a list of two offsets)")
    return Entry(code, tuple(shape), offsets[0], offsets[1])


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise HeaderError("'__metadata__' must map strings to strings")
    for key, item in value.items():
        _check_text(key, "'__metadata__' has a key")
        _check_text(item, f"'__metadata__' entry {key!r} has the value")
    return dict(value)


def _nbytes(name: str, entry: Entry) -> int:
    count = 1
    for size in entry.shape:  # left to right, as the reference overflows
        count *= size
        if count > _U64:
            raise HeaderError(f"tensor {name!r} has shape {list(entry.shape)}: too many elements")
    bits = count * _BITS[entry.code]
    if bits > _U64:
        raise HeaderError(f"tensor {name!r} has shape {list(entry.shape)}: too many elements")
    if bits % 8:
        raise HeaderError(
            f"tensor {name!r} ({entry.code}{list(entry.shape)}) does not fill a whole byte"
        )
    return bits // 8


def _check_count(raw: bytes) -> None:
    """Refuse, before parsing it, a header of more JSON values than `MAX_STRINGS` strings and
    `MAX_VALUES` values outside them: parsed, each costs memory (33M empty lists: 2.8 GB)."""
    if len(raw) <= 2 * MAX_STRINGS and len(raw) <= MAX_VALUES:
        return  # too short to hold that many (every string takes two quotes)
    strings = (raw.count(b'"') - raw.count(b'\\"')) // 2  # escaped quotes are inside strings
    if strings > MAX_STRINGS:
        raise HeaderError(
            f"its header holds about {strings:,} strings, more than the {MAX_STRINGS:,} a "
            "checkpoint's header may hold"
        )
    if raw.count(b",") > MAX_VALUES:  # then count only the commas outside strings
        values = _STRING.sub(b"", raw).count(b",") + 1
        if values > MAX_VALUES:
            raise HeaderError(
                f"its header holds about {values:,} values, more than the {MAX_VALUES:,} a "
                "checkpoint's header may hold"
            )


def parse_header(raw: bytes) -> tuple[dict[str, Any], dict[str, str], dict[str, Entry], int]:
    """Parse and validate a header.

    Returns:
        The raw tensor table (name -> entry object, as written), the metadata, the validated
        entries, and the number of data bytes the tensors cover.
    """
    _check_count(raw)
    free = _Free(raw)
    top = _decode(raw)
    if not isinstance(top, dict):
        raise HeaderError(f"its header is not a JSON object (it is {type(top).__name__})")
    pairs = top.pairs if isinstance(top, _Object) and top.pairs else top.items()
    metadata: dict[str, str] = {}
    seen_metadata = False
    entries: dict[str, Entry] = {}
    for name, value in pairs:
        if name == "__metadata__":
            if seen_metadata:
                raise HeaderError("its header gives '__metadata__' twice")
            seen_metadata = True
            metadata = _metadata(value)
        else:
            if not name.isascii():
                _check_text(name, "a tensor name")
            entries[name] = _entry(name, value, free)  # a repeated name keeps its last entry
    if len(entries) > MAX_TENSORS:
        raise HeaderError(_too_many())
    end = 0
    for name, entry in sorted(entries.items(), key=lambda item: item[1][2:]):
        if entry.begin != end or entry.end < entry.begin:
            where = "the start of the data" if end == 0 else f"byte {end}, where the tensor before"
            raise HeaderError(
                f"tensor {name!r} has data_offsets [{entry.begin}, {entry.end}], but tensors "
                f"must follow each other without gaps or overlaps: it should begin at {where}"
                + (" ends" if end else "")
            )
        nbytes = _nbytes(name, entry)
        if entry.end - entry.begin != nbytes:
            raise HeaderError(
                f"tensor {name!r} says data_offsets [{entry.begin}, {entry.end}] "
                f"({entry.end - entry.begin} bytes), but {entry.code}{list(entry.shape)} takes "
                f"{nbytes} bytes"
            )
        end = entry.end
    table = {name: value for name, value in top.items() if name != "__metadata__"}
    return table, metadata, entries, end
