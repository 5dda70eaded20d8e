"""One stored type: its table and everything done to its rows.

Identity: every object a table saved or loaded knows the id of its row: an entry in its own
``__dict__`` under a key of this database that no attribute can have, holding ``(row id,
id(object))`` so that a copy of the object (another ``id``) counts as new; slotted classes,
which have no ``__dict__``, are remembered in a weak map instead. Saving an object the table
knows updates that row; saving a new one inserts a row and returns its id, which never
changes.

References: a nested dataclass is saved with its parent (inserted or updated, by the same
identity rule) and stored as its row's id. Loading resolves references in one query per
referenced type for a whole result, or, for ``field(lazy=True)``, returns a stand-in of the
referenced type that loads its row on first access. Lists of dataclasses are rows of a link
table, saved and loaded with their owner. A reference whose row was deleted loads as None.
"""

import weakref

from .codegen import make_decoder, make_encoder
from .errors import ConflictError, NotFound, SchemaError, ValidationError
from .query import Fields, Query
from .schema import ensure
from .sql import link_table

_LAZY = "_sprout_lazy"


class Table:
    def __init__(self, db, model):
        self.db = db
        self.backend = db.backend
        self.model = model
        if model.slots and not hasattr(model.cls, "__weakref__"):
            raise SchemaError(f"{model.cls.__qualname__} uses slots: declare it with @dataclass(slots=True, weakref_slot=True)")
        ensure(self.backend, model)
        d, p, t = self.backend.dialect, self.backend.dialect.param, model.table
        self.key = None if model.slots else db.identity_key
        self.encode = make_encoder(model)
        self.decode = make_decoder(model, self.key)
        self.sql_insert = d.insert(model)
        self.sql_update = d.update(model)
        self.select_list = d.select(model)
        self.sql_select = f'SELECT {self.select_list} FROM "{t}"'
        self.sql_get = f"{self.sql_select} WHERE id = {p}"
        self.sql_delete = f'DELETE FROM "{t}" WHERE id = {p}'
        self.refs = [f for f in model.columns if f.kind == "ref"]
        self.flat = not self.refs and not model.reflists
        self.version_at = next((i for i, f in enumerate(model.columns) if f.is_version), None)
        self.links = {f.name: link_table(model, f) for f in model.reflists}
        self.fields = Fields(self)
        self._ids = {}
        self._lazy_class = None

    # ------------------------------------------------------------------ identity

    def id_of(self, obj):
        """The id of the row ``obj`` was saved as or loaded from (None if neither)."""
        if self.key is not None:
            entry = obj.__dict__.get(self.key)
            if entry is not None and entry[1] == id(obj):
                return entry[0]
            return None
        entry = self._ids.get(id(obj))
        if entry is not None and entry[1]() is obj:
            return entry[0]
        return None

    def _remember(self, obj, rowid):
        if self.key is not None:
            obj.__dict__[self.key] = (rowid, id(obj))
            return
        key = id(obj)
        ids = self._ids

        def forget(ref, key=key):
            if ids.get(key, (None, None))[1] is ref:
                del ids[key]

        ids[key] = (rowid, weakref.ref(obj, forget))

    def _forget(self, obj):
        if self.key is not None:
            obj.__dict__.pop(self.key, None)
        else:
            self._ids.pop(id(obj), None)

    # ------------------------------------------------------------------ writing

    def _check(self, obj):
        if not isinstance(obj, self.model.cls):
            raise ValidationError(self.model.cls.__qualname__, "(the object)", f"a {self.model.cls.__qualname__}", obj)

    def save(self, obj):
        """Insert ``obj`` (returning its new id) or update the row it came from (its id)."""
        self._check(obj)
        if self.flat and self.version_at is None:
            values = self.encode(obj, None)
            rowid = self.id_of(obj)
            if rowid is None:
                rowid = self.backend.insert(self.sql_insert, values)
                self._remember(obj, rowid)
                return rowid
            if self.backend.execute(self.sql_update, values + (rowid,)).rowcount == 1:
                return rowid
            rowid = self.backend.insert(self.sql_insert, values)  # its row was deleted meanwhile
            self._remember(obj, rowid)
            return rowid
        if self.backend.in_transaction():
            return self._save(obj, set())
        with self.backend.transaction():
            return self._save(obj, set())

    def _save(self, obj, saving):
        """Save within a transaction; `saving` holds the ids of objects being saved (cycles)."""
        if id(obj) in saving:
            rowid = self.id_of(obj)
            if rowid is None:
                raise ValidationError(self.model.cls.__qualname__, "(a reference)",
                                      "not a cycle of new objects: save one of them first", obj)
            return rowid
        saving.add(id(obj))

        def save_ref(child):
            return self.db.table(type(child))._save(child, saving)

        values = self.encode(obj, save_ref)
        rowid = self.id_of(obj)
        if rowid is not None and self.version_at is not None:
            expected = values[self.version_at]
            params = values[: self.version_at] + values[self.version_at + 1:] + (rowid, expected)
            if self.backend.execute(self.sql_update, params).rowcount != 1:
                raise ConflictError(f"{self.model.cls.__qualname__} {rowid} changed (or was deleted) since version {expected} was read")
            object.__setattr__(obj, self.model.version.name, expected + 1)
        elif rowid is not None and self.backend.execute(self.sql_update, values + (rowid,)).rowcount == 1:
            pass
        else:
            rowid = self.backend.insert(self.sql_insert, values)
            self._remember(obj, rowid)
        for f in self.model.reflists:
            self._save_list(obj, f, rowid, saving)
        saving.discard(id(obj))
        return rowid

    def _save_list(self, obj, f, rowid, saving):
        items = getattr(obj, f.name)
        if not isinstance(items, list) or any(not isinstance(x, f.element) for x in items):
            bad = items if not isinstance(items, list) else next(x for x in items if not isinstance(x, f.element))
            raise ValidationError(self.model.cls.__qualname__, f.name, f"a list of {f.element.__qualname__}", bad)
        target = self.db.table(f.element)
        ids = [target._save(x, saving) for x in items]
        p = self.backend.dialect.param
        self.backend.execute(f'DELETE FROM "{self.links[f.name]}" WHERE owner = {p}', (rowid,))
        if ids:
            self.backend.executemany(
                f'INSERT INTO "{self.links[f.name]}" (owner, position, target) VALUES ({p}, {p}, {p})',
                [(rowid, i, x) for i, x in enumerate(ids)],
            )

    def save_many(self, objs):
        """Save many objects in one transaction; returns their ids. New objects are inserted
        in batches, the objects they refer to first (one batch per referenced type), unless
        the type has lists of dataclasses, a version field or references that can cycle."""
        objs = list(objs)
        for obj in objs:
            self._check(obj)
        with self.backend.transaction():
            if not self._batchable() or any(self.id_of(o) is not None for o in objs):
                return [self._save(o, set()) for o in objs]
            save_ref = self._save_refs_batched(objs) if self.refs else None
            rows = [self.encode(o, save_ref) for o in objs]
            ids = self._insert_batch(rows)
            for obj, rowid in zip(objs, ids):
                self._remember(obj, rowid)
            return ids

    def _batchable(self, outer=()):
        """Whether new objects can be inserted in batches: no lists of dataclasses, no version
        field, and references (followed transitively) that never come back to a type."""
        if self.model.reflists or self.version_at is not None:
            return False
        outer = outer + (self.model.cls,)
        return all(f.element not in outer and self.db.table(f.element)._batchable(outer) for f in self.refs)

    def _save_refs_batched(self, objs):
        """Save what ``objs`` refer to: new objects in one batch per referenced type, in the
        order of ``objs`` and their fields, known ones updated; returns the ``save_ref`` the
        encoder calls, which answers each one's id."""
        children = {}  # referenced type -> {id(child): child}, in first-seen order
        for obj in objs:
            for f in self.refs:
                child = getattr(obj, f.name)
                if isinstance(child, f.element):  # others: the encoder raises ValidationError
                    children.setdefault(f.element, {}).setdefault(id(child), child)
        ids = {}
        for cls, found in children.items():
            target = self.db.table(cls)
            new = [c for c in found.values() if target.id_of(c) is None]
            for key, child in found.items():
                if target.id_of(child) is not None:
                    ids[key] = target._save(child, set())
            for child, rowid in zip(new, target.save_many(new)):
                ids[id(child)] = rowid
        return lambda child: ids[id(child)]

    def _insert_batch(self, rows):
        if not rows:
            return []
        if self.backend.dialect.name == "sqlite":
            # Under the write lock, rowids continue from the largest one, in order.
            start = self.backend.rows(f'SELECT COALESCE(MAX(id), 0) FROM "{self.model.table}"')[0][0] + 1
            self.backend.executemany(self.sql_insert, rows)
            return list(range(start, start + len(rows)))
        # Ids reserved from the table's sequence, then the rows, ids and all, in one COPY
        # rather than an INSERT ... RETURNING per row.
        d = self.backend.dialect
        ids = [row[0] for row in self.backend.rows(d.reserve_ids(self.model), (len(rows),))]
        self.backend.copy(d.copy_in(self.model), ((rowid,) + row for rowid, row in zip(ids, rows)))
        return ids

    def delete(self, obj_or_id):
        """Delete a row by object or id; returns whether there was one."""
        rowid = obj_or_id if type(obj_or_id) is int else self.id_of(obj_or_id)
        if rowid is None:
            return False
        if self.model.reflists:
            with self.backend.transaction():
                deleted = self._delete_ids([rowid])
        else:
            deleted = self.backend.execute(self.sql_delete, (rowid,)).rowcount
        if type(obj_or_id) is not int:
            self._forget(obj_or_id)
        return deleted > 0

    def _delete_ids(self, ids):
        if not ids:
            return 0
        params = []
        where = self.backend.dialect.in_list("id", ids, params)
        for link in self.links.values():
            owner_params = []
            self.backend.execute(f'DELETE FROM "{link}" WHERE {self.backend.dialect.in_list("owner", ids, owner_params)}', owner_params)
        return self.backend.execute(f'DELETE FROM "{self.model.table}" WHERE {where}', params).rowcount

    # ------------------------------------------------------------------ reading

    def get(self, rowid):
        """The object stored with id ``rowid``; NotFound if there is none."""
        rows = self.backend.rows(self.sql_get, (rowid,))
        if not rows:
            raise NotFound(f"no {self.model.cls.__qualname__} with id {rowid}")
        return self._load(rows)[0]

    def get_many(self, ids):
        """{id: object} for those of ``ids`` that exist."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        params = []
        rows = self.backend.rows(f"{self.sql_select} WHERE {self.backend.dialect.in_list('id', ids, params)}", params)
        objs = self._load(rows)
        return {row[0]: obj for row, obj in zip(rows, objs)}

    def _load(self, rows):
        decode = self.decode
        objs = [decode(row) for row in rows]
        if self.key is None:  # slotted: the decoder could not record identities
            for row, obj in zip(rows, objs):
                self._remember(obj, row[0])
        if self.refs:
            self._resolve_refs(objs)
        if self.model.reflists:
            self._load_lists(objs, [row[0] for row in rows])
        return objs

    def _resolve_refs(self, objs):
        for f in self.refs:
            target = self.db.table(f.element)
            ids = [getattr(o, f.name) for o in objs]
            present = [i for i in ids if i is not None]
            if f.lazy:
                found = {i: target._stand_in(i) for i in set(present)}
            else:
                found = target.get_many(present) if present else {}
            for obj, i in zip(objs, ids):
                object.__setattr__(obj, f.name, None if i is None else found.get(i))

    def _load_lists(self, objs, owners):
        for f in self.model.reflists:
            params = []
            where = self.backend.dialect.in_list("owner", owners, params)
            links = self.backend.rows(f'SELECT owner, target FROM "{self.links[f.name]}" WHERE {where} ORDER BY owner, position', params)
            targets = self.db.table(f.element).get_many([t for _, t in links])
            by_owner = {}
            for owner, t in links:
                if t in targets:
                    by_owner.setdefault(owner, []).append(targets[t])
            for obj, owner in zip(objs, owners):
                object.__setattr__(obj, f.name, by_owner.get(owner, []))

    def _stand_in(self, rowid):
        """An object of this table's type that loads row ``rowid`` when first touched."""
        if self._lazy_class is None:
            self._lazy_class = _lazy_class(self)
        obj = object.__new__(self._lazy_class)
        obj.__dict__[_LAZY] = rowid
        self._remember(obj, rowid)
        return obj

    # ------------------------------------------------------------------ queries

    def query(self, where=None):
        """A query over this table, optionally with a condition."""
        q = Query(self)
        return q.where(where) if where is not None else q

    def run(self, query):
        sql, params = query.compile(self.backend.dialect, self.select_list)
        objs = self._load(self.backend.rows(sql, params))
        if query._predicates:
            objs = [o for o in objs if all(p(o) for p in query._predicates)]
            end = None if query._limit is None else query._offset + query._limit
            objs = objs[query._offset:end]
        return objs

    def count_query(self, query):
        if query._predicates:
            return len(self.run(query))
        sql, params = query.compile(self.backend.dialect, "COUNT(*)", paged=False)
        return self.backend.rows(sql, params)[0][0]

    def ids_of_query(self, query):
        if query._predicates:
            return [self.id_of(o) for o in self.run(query)]
        sql, params = query.compile(self.backend.dialect, "id")
        return [row[0] for row in self.backend.rows(sql, params)]

    def delete_query(self, query):
        ids = self.ids_of_query(query)
        if self.model.reflists:
            with self.backend.transaction():
                return self._delete_ids(ids)
        return self._delete_ids(ids)

    def all(self):
        """Every object of the table."""
        return self._load(self.backend.rows(self.sql_select))

    def count(self):
        return self.backend.rows(f'SELECT COUNT(*) FROM "{self.model.table}"')[0][0]


def _lazy_class(table):
    cls = table.model.cls
    names = frozenset(f.name for f in table.model.fields)

    def __getattribute__(self, name):
        d = object.__getattribute__(self, "__dict__")
        rowid = d.get(_LAZY)
        # Touching a field, or asking its class (as dataclass equality does), loads the row.
        if rowid is not None and (name in names or name == "__class__"):
            rows = table.backend.rows(table.sql_get, (rowid,))
            if not rows:
                raise NotFound(f"the {cls.__qualname__} {rowid} this object refers to was deleted")
            loaded = table._load(rows)[0]
            d.pop(_LAZY)
            d.update(loaded.__dict__)
            object.__setattr__(self, "__class__", cls)
        return object.__getattribute__(self, name)

    def __repr__(self):
        getattr(self, next(iter(names))) if names else None
        return cls.__repr__(self)

    return type(f"Lazy{cls.__name__}", (cls,), {"__getattribute__": __getattribute__, "__repr__": __repr__})
