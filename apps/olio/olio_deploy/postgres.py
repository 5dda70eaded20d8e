"""The deployment's PostgreSQL: a persistent cluster in STATE/pg, sized for the deployment's cores.

Debian's binaries; initdb once, then started inside the confinement at every `up`, holding the
database `olio` that the role `olio` reaches over 127.0.0.1 with a password."""

import os
import pwd
from pathlib import Path
from urllib.parse import quote

from sprout.store.pgserver import server_binary

from .procs import DeployError, alive, demote_to, descendants, read_pid, run, tail

USER = "postgres"
DATABASE = ROLE = "olio"


def memory_share(cores):
    """This deployment's share of the machine's memory: the fraction of the CPUs it has."""
    with open("/proc/meminfo") as f:
        total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return total_kb * 1024 * cores // max(os.cpu_count() or 1, cores)


def settings_text(port, socket_dir, log_dir, cores, max_connections, memory_bytes):
    mb = memory_bytes >> 20
    shared = min(mb // 4, 8192)
    return f"""\
# Written by olio_deploy (postgres.py) at every `up`: a competent operator's settings for an
# OLTP web site on {cores} core(s) and a {mb} MiB share of this machine's memory.

listen_addresses = '127.0.0.1'       # the app tier is on this host (sandboxes share its network)
port = {port}
unix_socket_directories = '{socket_dir}'   # administration only (root and postgres may enter)
# Every app process holds one connection (a gunicorn worker, or a Sprout sandbox), plus room
# for the loader, administration and the 3 superuser slots.
max_connections = {max_connections}

# Memory: a quarter of the share for PostgreSQL's own cache (the usual advice), the planner
# told that the kernel's page cache holds about half of it.
shared_buffers = {shared}MB
effective_cache_size = {max(mb // 2, 128)}MB
work_mem = 4MB                        # per sort or hash; Olio's queries sort tens of rows
maintenance_work_mem = {min(max(mb // 16, 64), 1024)}MB   # index builds after a bulk load

# Durability is left as it should be: every commit waits for its WAL flush.
synchronous_commit = on
fsync = on
# Room for a bulk load between checkpoints, spread over 90% of the interval.
max_wal_size = 4GB
checkpoint_completion_target = 0.9

# CPU: Olio's queries are short and indexed. Parallel workers would compete with the app
# tier for the same cores, and JIT compilation costs more than such queries take.
max_worker_processes = {max(cores, 2) + 2}
max_parallel_workers = {cores}
max_parallel_workers_per_gather = 0
max_parallel_maintenance_workers = {min(cores, 4) - 1 if cores > 1 else 0}
jit = off
# Storage is an SSD-backed virtual disk: random reads cost about what sequential ones do.
random_page_cost = 1.1
effective_io_concurrency = 200

# Logs: to files (kept a week, one per weekday), with what helps under load.
logging_collector = on
log_directory = '{log_dir}'
log_filename = 'postgresql-%a.log'
log_truncate_on_rotation = on
log_rotation_age = 1d
log_rotation_size = 0
log_line_prefix = '%m [%p] %q%u@%d '
log_min_duration_statement = 500ms    # slow statements, against Olio's 1-4 s response limits
log_checkpoints = on
log_lock_waits = on
log_connections = off
log_temp_files = 0
"""


HBA = f"""\
# Written by olio_deploy (postgres.py). Superuser access only through the Unix socket, whose
# directory only root and postgres can enter; the app's role only to its own database, over
# loopback, with a SCRAM password.
# TYPE  DATABASE    USER        ADDRESS         METHOD
local   all         {USER}                      trust
host    {DATABASE:<11} {ROLE:<11} 127.0.0.1/32    scram-sha-256
"""


class Postgres:
    def __init__(self, state, port, cores, max_connections, log=print):
        self.dir = state.pg
        self.data = self.dir / "data"
        self.socket_dir = self.dir / "run"
        self.log_dir = self.dir / "log"
        self.start_log = self.log_dir / "startup.log"  # written by pg_ctl, as postgres
        self.port, self.cores, self.max_connections, self.log = port, cores, max_connections, log

    def _as_postgres(self, argv, what, timeout=300):
        return run(argv, what, preexec=demote_to(USER) if os.geteuid() == 0 else None, timeout=timeout, cwd=self.dir)

    def _as_postgres_confined(self, confinement):
        demote = demote_to(USER) if os.geteuid() == 0 else (lambda: None)

        def preexec():
            confinement.enter()  # as root, before giving it up
            demote()

        return preexec

    def init(self):
        """Create the cluster once; later calls keep it (and its data)."""
        owner = pwd.getpwnam(USER) if os.geteuid() == 0 else None
        for d in (self.dir, self.socket_dir, self.log_dir):
            d.mkdir(mode=0o700, exist_ok=True)
            if owner:
                os.chown(d, owner.pw_uid, owner.pw_gid)
        if (self.data / "PG_VERSION").exists():
            return False
        self.log(f"creating the PostgreSQL cluster in {self.data}")
        self._as_postgres([server_binary("initdb"), "-D", str(self.data), "-U", USER, "-E", "UTF8", "--locale=C", "--auth=trust"],
                          "initdb")
        return True

    def configure(self):
        memory = memory_share(self.cores)
        conf = settings_text(self.port, self.socket_dir, self.log_dir, self.cores, self.max_connections, memory)
        self._write(self.data / "olio.conf", conf)
        self._write(self.data / "pg_hba.conf", HBA)
        main = self.data / "postgresql.conf"
        if "include 'olio.conf'" not in main.read_text():
            with open(main, "a") as f:
                f.write("\n# The deployment's settings (olio_deploy); they override the defaults above.\ninclude 'olio.conf'\n")

    def _write(self, path, text):
        path.write_text(text)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(USER)
            os.chown(path, owner.pw_uid, owner.pw_gid)
        path.chmod(0o600)

    def start(self, confinement):
        try:
            run([server_binary("pg_ctl"), "-D", str(self.data), "-l", str(self.start_log), "-w", "-t", "120", "start"],
                "starting PostgreSQL", preexec=self._as_postgres_confined(confinement), cwd=self.dir, timeout=150)
        except DeployError as e:
            logs = sorted(self.log_dir.glob("postgresql-*.log"), key=lambda p: p.stat().st_mtime)
            raise DeployError(f"{e}\n{tail(self.start_log)}\n{tail(logs[-1]) if logs else ''}") from None

    def pid(self):
        """The postmaster's pid, if it runs."""
        pid = read_pid(self.data / "postmaster.pid")
        return pid if alive(pid) else None

    def processes(self):
        pid = self.pid()
        return [pid, *descendants(pid)] if pid else []

    def stop(self):
        if self.pid() is None:
            return False
        stop = [server_binary("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "stop"]
        preexec = demote_to(USER) if os.geteuid() == 0 else None
        try:
            run([*stop, "-m", "fast"], "stopping PostgreSQL", preexec=preexec, cwd=self.dir, timeout=90)
        except DeployError as e:
            # A server still recovering from a crash (a backend killed at a memory limit) may
            # not finish a fast shutdown in time: stop it at once (it recovers at next start).
            self.log(f"{e}; stopping it immediately")
            run([*stop, "-m", "immediate"], "stopping PostgreSQL immediately", preexec=preexec, cwd=self.dir, timeout=90)
        return True

    def _admin(self):
        import psycopg

        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=USER, dbname="postgres", autocommit=True)

    def setup_database(self, password):
        """Make (or update) the role and the database; returns the app's URL."""
        from psycopg import sql

        with self._admin() as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(password)))
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(DATABASE), sql.Identifier(ROLE)))
        return self.url(password)

    def url(self, password):
        return f"postgresql://{ROLE}:{quote(password, safe='')}@127.0.0.1:{self.port}/{DATABASE}"

    def _olio(self):
        import psycopg

        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=USER, dbname=DATABASE, autocommit=True)

    def rows_in(self, table):
        """Rows of `table` in the olio database (0 when the table does not exist)."""
        from psycopg import sql

        with self._olio() as conn:
            if not conn.execute("SELECT 1 FROM information_schema.tables WHERE table_name = %s", (table,)).fetchone():
                return 0
            return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]

    def vacuum_analyze(self):
        """VACUUM (ANALYZE) the olio database: after a bulk load, so that autovacuum's
        insert-triggered VACUUM does not run later, inside a measurement."""
        with self._olio() as conn:
            conn.execute("VACUUM (ANALYZE)")


def server_log(pg):
    logs = sorted(Path(pg.log_dir).glob("postgresql-*.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None
