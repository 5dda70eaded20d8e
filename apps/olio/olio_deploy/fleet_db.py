"""The fleet's PostgreSQL: one cluster, one database per site, all copied from one loaded template.

Olio's loader runs once, into the template database `olio__template` (a name no site can
have: site names hold no '_'), which is then vacuumed, analyzed and closed to connections;
each site's database `olio_<name>` is a `CREATE DATABASE ... TEMPLATE` copy of it, so a
thousand sites cost one load and a thousand file copies. The template carries a stamp of
what was loaded (registered users, seed): a later `fleet-up` with the same keeps it and the
sites' databases (with whatever the sites wrote since), a different one reloads and copies
again; `--fresh` copies every site's database again from the template.

Every site connects as the one role `olio` (with the deployment's password), over
127.0.0.1, and only to the fleet's databases: pg_hba.conf names them through the file
`fleet-databases` beside it. The sites run the same code for one operator; a role per site
would make each copy's tables need new owners (a REASSIGN per database) for no isolation
the code needs.
"""

import math
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from .postgres import ROLE, USER, Postgres, settings_text
from .procs import DeployError

TEMPLATE = "olio__template"
DATABASES_FILE = "fleet-databases"

HBA = f"""\
# Written by olio_deploy (fleet_db.py). Superuser access only through the Unix socket, whose
# directory only root and postgres can enter; the sites' role only to the fleet's databases
# (listed in {DATABASES_FILE}), over loopback, with a SCRAM password.
# TYPE  DATABASE            USER        ADDRESS         METHOD
local   all                 {USER}                      trust
host    @{DATABASES_FILE:<18} {ROLE:<11} 127.0.0.1/32    scram-sha-256
"""


def database(name):
    """The database of site `name`."""
    return f"olio_{name}"


def fleet_settings(sites, memory_mb):
    # The launcher starts one autovacuum worker per database per naptime: with a thousand
    # databases and the default minute, one every 60 ms, each connecting and scanning its
    # catalog, on the deployment's cores. Mostly idle sites write little; half a second per
    # site keeps the launcher to at most two workers a second.
    naptime = max(60, math.ceil(sites * 0.5))
    return f"""
# The fleet's own settings (fleet_db.py): {sites} site database(s) under a memory budget of
# {memory_mb} MiB for the whole deployment. The memory settings above were computed for half of
# it, so shared_buffers is an eighth of the budget.
autovacuum_naptime = {naptime}s
"""


class FleetPostgres(Postgres):
    """The cluster in STATE/pg, sized for the fleet, holding the template and the sites'
    databases."""

    def __init__(self, state, port, cores, max_connections, memory_mb, names, log=print):
        super().__init__(state, port, cores, max_connections, log=log)
        self.memory_mb, self.names = memory_mb, list(names)

    def configure(self):
        conf = settings_text(self.port, self.socket_dir, self.log_dir, self.cores, self.max_connections,
                             (self.memory_mb << 20) // 2)
        self._write(self.data / "olio.conf", conf + fleet_settings(len(self.names), self.memory_mb))
        self._write(self.data / "pg_hba.conf", HBA)
        self._write(self.data / DATABASES_FILE, "\n".join([TEMPLATE] + [database(n) for n in self.names]) + "\n")
        main = self.data / "postgresql.conf"
        if "include 'olio.conf'" not in main.read_text():
            with open(main, "a") as f:
                f.write("\n# The deployment's settings (olio_deploy); they override the defaults above.\ninclude 'olio.conf'\n")

    def url_of(self, db, password, host="127.0.0.1", port=True):
        """The sites' role's URL of database `db` (at `host`; without the port when not `port`)."""
        where = f"{host}:{self.port}" if port else host
        return f"postgresql://{ROLE}:{quote(password, safe='')}@{where}/{db}"

    def _connect(self, dbname):
        import psycopg

        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=USER, dbname=dbname, autocommit=True)

    def setup_role(self, password):
        from psycopg import sql

        with self._admin() as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(password)))

    def databases(self):
        with self._admin() as conn:
            return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}

    def ensure_template(self, password, users, seed, files, env):
        """Load the template unless it holds this load already (and the file store its
        pictures); True when it was (re)loaded."""
        from psycopg import sql

        stamp = f"olio_deploy fleet template: registered_users={users} seed={seed}"
        with self._admin() as conn:
            row = conn.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                               (TEMPLATE,)).fetchone()
        if row and row[0] == stamp and (Path(files) / "loader").is_dir():
            self.log(f"the template database holds {users} users (seed {seed}) already: not loading")
            return False
        with self._admin() as conn:
            old = [r[0] for r in conn.execute(r"SELECT datname FROM pg_database WHERE datname LIKE 'olio\_%'")]
            if old:
                self.log(f"dropping {len(old)} database(s) of an earlier load")
            for name in old:
                conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(TEMPLATE), sql.Identifier(ROLE)))
        argv = [sys.executable, "-m", "olio.loader", "--users", str(users), "--allow-small", "--seed", str(seed),
                "--db", self.url_of(TEMPLATE, password), "--files", str(files)]
        self.log(f"loading the template database: {users} users (seed {seed})")
        started = time.monotonic()
        # The loader's summary goes to stdout: here, to stderr (fleet-up's stdout is its JSON).
        if subprocess.run(argv, env=env, stdout=sys.stderr).returncode:
            raise DeployError("the loader failed (its message is above)")
        with self._connect(TEMPLATE) as conn:
            conn.execute("VACUUM (ANALYZE, FREEZE)")
        with self._admin() as conn:
            conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(TEMPLATE), sql.Literal(stamp)))
            # Nobody connects to it again: a copy needs it without other sessions.
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(TEMPLATE)))
        self.log(f"loaded, vacuumed and analyzed the template in {time.monotonic() - started:.1f} s")
        return True

    def make_site_databases(self, fresh=False, connections=3):
        """CREATE DATABASE olio_<name> TEMPLATE olio__template for every site lacking one
        (every site with `fresh`), over a few connections at once; progress every 50.

        The copies use PostgreSQL 15's default strategy, WAL_LOG (every block through the
        WAL): measured here on a 10 MB template it took 27 ms a copy against FILE_COPY's
        52-220 ms (a checkpoint before and after each copy, slower as the cluster grows);
        three at once brought it to 15 ms."""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from psycopg import sql

        have = self.databases()
        todo = [n for n in self.names if fresh or database(n) not in have]
        if not todo:
            self.log(f"every site's database exists already ({len(self.names)})")
            return 0
        self.log(f"copying the template into {len(todo)} site database(s)")
        started, lock, done = time.monotonic(), threading.Lock(), [0]

        def copy(names):
            with self._admin() as conn:
                for name in names:
                    db = sql.Identifier(database(name))
                    if database(name) in have:
                        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(db))
                    conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(
                        db, sql.Identifier(TEMPLATE), sql.Identifier(ROLE)))
                    with lock:
                        done[0] += 1
                        if done[0] % 50 == 0 or done[0] == len(todo):
                            self.log(f"  {done[0]} of {len(todo)} site databases ({time.monotonic() - started:.1f} s)")

        with ThreadPoolExecutor(connections) as pool:
            for future in [pool.submit(copy, todo[i::connections]) for i in range(connections)]:
                future.result()
        return len(todo)
