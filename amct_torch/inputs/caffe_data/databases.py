"""Caffe's key-value databases (``DataParameter.backend``): LMDB and LevelDB, read in key
order from a record number on, wrapping round to the first record at the end as Caffe's
DataLayer does. Only the well-kept bindings read them (``lmdb``, ``plyvel``)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.optional_deps import require


def key_text(key: bytes) -> str:
    """A record's key for an error message."""
    return repr(key.decode("utf-8", "replace"))[1:-1][:120]


class Database:
    """An open database: ``count`` records; ``records(first)`` yields (key, value) from
    record number ``first`` on, endlessly; ``first_value()`` is the first record's value."""

    path: str
    count: int

    def records(self, first: int) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def first_value(self) -> tuple[bytes, bytes]:
        return next(iter(self.records(0)))

    def close(self) -> None:
        raise NotImplementedError


class LmdbDatabase(Database):
    """An LMDB folder (``data.mdb``) as ``convert_imageset --backend=lmdb`` writes it."""

    def __init__(self, path: str, layer: str) -> None:
        lmdb = require("lmdb", "LMDB data", path)
        self.path, self._lmdb = path, lmdb
        if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "data.mdb")):
            raise DataError("not an LMDB database (a folder holding data.mdb); if it is a "
                            "LevelDB, say backend: LEVELDB", file=path, layer=layer)
        try:
            self._env = lmdb.open(path, readonly=True, lock=False, readahead=False,
                                  subdir=True, max_readers=512)
            info, stat = self._env.info(), self._env.stat()
        except lmdb.Error as err:
            raise DataError(f"not a readable LMDB database ({err})", file=path,
                            layer=layer) from None
        size = os.path.getsize(os.path.join(path, "data.mdb"))
        needed = (info["last_pgno"] + 1) * stat["psize"]
        if size < needed:  # reading past the end of a mapped file would crash the process
            self._env.close()
            raise DataError(f"the LMDB database is truncated: data.mdb has {size} bytes, its "
                            f"pages need {needed}", file=path, layer=layer)
        self.count = int(stat["entries"])
        if self.count == 0:
            self._env.close()
            raise DataError("the database is empty", file=path, layer=layer)
        self.layer = layer

    def records(self, first: int) -> Iterator[tuple[bytes, bytes]]:
        lmdb = self._lmdb
        key = b""
        try:
            with self._env.begin(buffers=False) as txn:
                cur = txn.cursor()
                cur.first()
                for _ in range(first % self.count):
                    cur.next()
                while True:
                    key = cur.key()
                    yield key, cur.value()
                    if not cur.next():
                        cur.first()
        except lmdb.Error as err:
            raise DataError(f"the LMDB database is damaged near key '{key_text(key)}' "
                            f"({err})", file=self.path, layer=self.layer) from None

    def close(self) -> None:
        self._env.close()


class LevelDbDatabase(Database):
    """A LevelDB folder as ``convert_imageset --backend=leveldb`` writes it (plyvel)."""

    def __init__(self, path: str, layer: str) -> None:
        plyvel = require("plyvel", "LevelDB data", path)
        self.path, self.layer, self._plyvel = path, layer, plyvel
        if os.path.isfile(os.path.join(path, "data.mdb")):
            raise DataError("this is an LMDB database; say backend: LMDB in data_param",
                            file=path, layer=layer)
        if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "CURRENT")):
            raise DataError("not a LevelDB database (a folder holding CURRENT)", file=path,
                            layer=layer)
        try:
            self._db = plyvel.DB(path, create_if_missing=False, paranoid_checks=True)
            self.count = sum(1 for _ in self._db.iterator(include_value=False))
        except plyvel.Error as err:
            raise DataError(f"not a readable LevelDB database ({err})", file=path,
                            layer=layer) from None
        if self.count == 0:
            self._db.close()
            raise DataError("the database is empty", file=path, layer=layer)

    def records(self, first: int) -> Iterator[tuple[bytes, bytes]]:
        key = b""
        skip = first % self.count
        try:
            while True:
                it: Any = self._db.iterator()
                try:
                    for key, value in it:
                        if skip:
                            skip -= 1
                            continue
                        yield key, value
                finally:
                    it.close()
        except self._plyvel.Error as err:
            raise DataError(f"the LevelDB database is damaged near key '{key_text(key)}' "
                            f"({err})", file=self.path, layer=self.layer) from None

    def close(self) -> None:
        self._db.close()


def open_database(path: str, backend: str, layer: str) -> Database:
    """``path`` opened with ``backend`` ("LMDB" or "LEVELDB")."""
    return LmdbDatabase(path, layer) if backend == "LMDB" else LevelDbDatabase(path, layer)
