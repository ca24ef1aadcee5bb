"""A GGUF file's header, read as the format says: its metadata's scalars and its tensors' names, shapes, types and places.

The gguf package's GGUFReader reads the same header into a NumPy memory-map view per value: for SmolLM2's vocabulary
(49,152 tokens and 48,900 merges) that is about a million small arrays, 2.4 s on every run. attnviz needs the
sizes (scalars) and where each tensor lies, so this reads the header once with `struct`, steps over the arrays'
elements without keeping them (an array is kept as its length), and reads a tensor's bytes when asked
(`tensor_bytes`), which `gguf.quants.dequantize` turns into float32.

The layout (GGUF version 2 and 3, little-endian; github.com/ggml-org/ggml, docs/gguf.md):
    "GGUF", version u32, tensor count u64, metadata count u64
    metadata: key (string), value type u32, value    a string is a u64 length and UTF-8 bytes; an array an
                                                     element type u32, a count u64 and the elements
    tensor infos: name (string), dimensions u32, each dimension u64 (the fastest first), type u32, offset u64
    the tensors' data, from the first multiple of general.alignment (32 by default) after the infos
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# GGUF's value types (gguf.GGUFValueType's numbers) -> their struct formats; 8 is a string, 9 an array
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file attnviz can read, or it is cut short; the message says where."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml's order: the fastest axis first
    type: int  # gguf.GGMLQuantizationType's number
    offset: int  # from the file's start


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, Any]  # key -> a scalar, a string, or for an array its length (ArrayLength)
    tensors: list[TensorInfo]


class ArrayLength(int):
    """An array's value as the header keeps it: how many elements it has (the elements were stepped over)."""


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at path; a GGUFFormatError where it is not one, or ends inside its header."""
    with open(path, "rb") as file:
        reader = _Reader(file)
        if reader.read(4) != MAGIC:
            raise GGUFFormatError("it does not start with GGUF's magic bytes")
        version = reader.unpack("<I")
        if version not in VERSIONS:
            raise GGUFFormatError(f"its GGUF version is {version} (attnviz reads versions 2 and 3, little-endian)")
        num_tensors, num_fields = reader.unpack("<Q"), reader.unpack("<Q")
        fields = {reader.string(): reader.value(reader.unpack("<I")) for _ in range(num_fields)}
        infos = []
        for _ in range(num_tensors):
            name = reader.string()
            dims = tuple(reader.unpack("<Q") for _ in range(reader.unpack("<I")))
            infos.append((name, dims, reader.unpack("<I"), reader.unpack("<Q")))
        alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-reader.position // alignment) * alignment
    tensors = [TensorInfo(name, dims, tensor_type, data_start + offset) for name, dims, tensor_type, offset in infos]
    return GGUFHeader(fields, tensors)


def tensor_bytes(path: Path, tensor: TensorInfo):
    """The tensor's stored bytes as gguf.quants.dequantize takes them: uint8 (rows, bytes a row), rows every axis but
    the fastest. Read from the file (not a memory map: the process keeps no page of it once dequantised)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.type)]
    row_bytes = tensor.dims[0] // block_size * type_size
    rows = int(np.prod(tensor.dims[1:], dtype=np.int64))
    data = np.fromfile(path, dtype=np.uint8, count=rows * row_bytes, offset=tensor.offset)
    if data.size != rows * row_bytes:
        raise GGUFFormatError(f"it ends inside tensor {tensor.name}")
    return data.reshape(rows, row_bytes)


class _Reader:
    """The header's values in the order they lie, read through a buffered file."""

    def __init__(self, file):
        self.file = file
        self.position = 0

    def read(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise GGUFFormatError(f"it ends inside its header (at byte {self.position + len(data)})")
        self.position += size
        return data

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, value_type: int):
        if value_type in SCALAR_FORMATS:
            return self.unpack(SCALAR_FORMATS[value_type])
        if value_type == STRING:
            return self.string()
        if value_type != ARRAY:
            raise GGUFFormatError(f"its header holds a value of unknown type {value_type}")
        element_type, count = self.unpack("<I"), self.unpack("<Q")
        if element_type in SCALAR_FORMATS:  # numbers: stepped over whole
            self.read(struct.calcsize(SCALAR_FORMATS[element_type]) * count)
        elif element_type == STRING:  # strings: each one's length read to step over its bytes
            for _ in range(count):
                self.read(self.unpack("<Q"))
        else:
            raise GGUFFormatError(f"its header holds an array of unknown type {element_type}")
        return ArrayLength(count)
