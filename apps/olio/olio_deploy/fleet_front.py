"""What both conventional fleets share: nginx with a server per site in front, memcached, each site's olio.toml.

nginx has one `server` per site (server_name its host; /static/ and /files/ from disk as for
one site; everything else passed to the site's app server over its Unix socket, by HTTP to
gunicorn or by the uwsgi protocol to a uWSGI vassal) and a default server answering 404 to
any other host. Each site's app runs `olio.wsgi:app` with its own olio.toml (its own
database, its own cookie key), as www-data when that user can import the app from the
virtual environment (conventional.py makes it), the cache is Debian's memcached.
"""

import json
import os
import signal
import subprocess

from . import conventional
from .conventional import MEMCACHED, NGINX, WEB_USER
from .fleet_db import database
from .procs import DeployError, alive, children, daemon_pid, demote_to, group_id, read_pid, run, stop, wait_for_port

# How nginx passes a request on, by the app server's protocol: the directive, and the file of
# settings it includes (nginx_includes).
PASSES = {"http": ("proxy_pass http://site_{name};", "nginx-proxy.conf"),
          "uwsgi": ("uwsgi_pass site_{name};", "nginx-uwsgi.conf")}


def site_dir(fd, site):
    """STATE/run/sites/<name>: the site's socket and pid files."""
    return fd.state.run / "sites" / site.name


def nginx_conf(fd, socket_of, protocol="http", writer="fleet_conventional.py"):
    """nginx.conf: a server per site passing requests to `socket_of(site)` by `protocol`."""
    run_dir, logs, temp = fd.state.run, fd.state.logs, fd.state.run / "nginx"
    directive, include = PASSES[protocol]
    upstreams, servers = [], []
    for site in fd.sites:
        upstreams.append(f"    upstream site_{site.name} {{ server unix:{socket_of(site)} fail_timeout=0; }}\n")
        servers.append(f"""
    server {{
        listen {fd.bind}:{fd.port};
        server_name {site.host};
        include {fd.state.conf}/nginx-site-common.conf;
        location / {{
            {directive.format(name=site.name)}
            include {fd.state.conf}/{include};
        }}
    }}
""")
    return f"""\
# Written by olio_deploy ({writer}) at every fleet-up; edits are lost.
# {len(fd.sites)} Olio site(s), one server each, told apart by Host; any other host: 404.

user {WEB_USER};
worker_processes {fd.cores};
worker_rlimit_nofile 16384;
pid {run_dir}/nginx.pid;
error_log {logs}/nginx-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    server_tokens off;
    server_names_hash_max_size {max(512, 2 * len(fd.sites))};
    server_names_hash_bucket_size 128;

    log_format olio '$host $remote_addr [$time_local] "$request" $status $body_bytes_sent '
                    '$request_time "$upstream_addr" $upstream_response_time';
    access_log {logs}/nginx-access.log olio buffer=64k flush=5s;

    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65s;
    keepalive_requests 10000;
    client_max_body_size {fd.max_body_mb}m;
    client_body_buffer_size 256k;
    open_file_cache max=10000 inactive=60s;
    open_file_cache_valid 30s;

    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;

{"".join(upstreams)}
    # A host the fleet does not name.
    server {{
        listen {fd.bind}:{fd.port} default_server backlog=4096;
        server_name _;
        return 404;
    }}
{"".join(servers)}}}
"""


def nginx_includes(fd):
    common = f"""\
# Every site's static assets and file store, as for one site (conventional.py).
location /static/ {{
    alias {fd.static_dir}/;
    expires 1h;
}}
location /files/ {{
    alias {fd.files}/;
    expires 7d;
    location ~ /\\. {{ return 404; }}
}}
"""
    proxy = """\
proxy_set_header Host $http_host;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto $scheme;
proxy_redirect off;
"""
    # nginx's own list of the CGI variables (REQUEST_METHOD, QUERY_STRING, SERVER_NAME, ...); the
    # request's headers, Host among them, travel as HTTP_* without being named.
    uwsgi = "include /etc/nginx/uwsgi_params;\n"
    return {"nginx-site-common.conf": common, "nginx-proxy.conf": proxy, "nginx-uwsgi.conf": uwsgi}


def site_config_path(fd, site):
    return fd.state.conf / "sites" / f"{site.name}.olio.toml"


def write_site_config(fd, site):
    path = site_config_path(fd, site)
    values = {"db": fd.postgres.url_of(database(site.name), fd.db_password),
              "cache": f"127.0.0.1:{fd.ports['cache']}" if fd.cache else "", "files": str(fd.files),
              "secret": fd.site_secret(site.name)}
    path.write_text(f"# Written by olio_deploy: Olio site {site.name} ({site.host}).\n"
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    os.chmod(path, 0o640)
    if os.geteuid() == 0:
        os.chown(path, 0, group_id(WEB_USER))


def clean_env():
    """This process's environment without Python's own settings (the app's are given)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYENV", "VIRTUAL_ENV"))}


def app_env(fd, site):
    env = clean_env()
    env["PYTHONPATH"] = fd.pythonpath
    env["OLIO_CONFIG"] = str(site_config_path(fd, site))
    return env


def app_user(fd, server):
    """www-data when it can run the interpreter and import the app, else root (warned); None
    when not started as root."""
    if os.geteuid() != 0:
        return None
    try:
        out = subprocess.run([str(fd.venv / "bin" / "python"), "-c", "import olio.wsgi"], env=app_env(fd, fd.sites[0]),
                             capture_output=True, preexec_fn=demote_to(WEB_USER), timeout=120, cwd="/")
        if out.returncode == 0:
            return WEB_USER
        why = (out.stderr.decode(errors="replace").strip().splitlines() or [f"exit {out.returncode}"])[-1]
    except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
    fd.log(f"warning: {WEB_USER} cannot import the app with {fd.venv}/bin/python ({why}); {server} runs as root")
    return "root"


def prepare(fd, extra_dirs=()):
    """Check nginx and memcached are there, make the virtual environment (fd.venv), the
    directories (www-data's group may enter the sockets' and logs'), every site's olio.toml
    and nginx's include files."""
    state = fd.state
    if not os.path.exists(NGINX):
        raise DeployError("nginx is not installed (scripts/setup.sh installs it: apt-get install nginx)")
    if fd.cache and not os.path.exists(MEMCACHED):
        raise DeployError("memcached is not installed (scripts/setup.sh installs it)")
    fd.venv = conventional.ensure_venv(fd)
    for d in (state.conf / "sites", state.logs / "sites", state.run / "sites", state.run / "nginx"):
        d.mkdir(parents=True, exist_ok=True)
    web_gid = group_id(WEB_USER) if os.geteuid() == 0 else None
    for d in [state.run / "nginx", state.logs / "sites", *extra_dirs] + [site_dir(fd, s) for s in fd.sites]:
        d.mkdir(exist_ok=True)
        if web_gid is not None:
            os.chown(d, 0, web_gid)
        d.chmod(0o770)
    for site in fd.sites:
        write_site_config(fd, site)
    for name, text in nginx_includes(fd).items():
        (state.conf / name).write_text(text)


def start_cache(fd):
    if fd.cache:
        conventional.start_memcached(fd)


def start_nginx(fd, conf_text):
    state = fd.state
    (state.conf / "nginx.conf").write_text(conf_text)
    nginx = [NGINX, "-p", str(state.run), "-e", str(state.logs / "nginx-error.log"), "-c", str(state.conf / "nginx.conf")]
    run(nginx + ["-t", "-q"], "checking nginx.conf")
    fd.log(f"starting nginx: {fd.cores} worker process(es) on {fd.bind}:{fd.port}, {len(fd.sites)} server(s)")
    run(nginx, "starting nginx", preexec=fd.enter)
    wait_for_port(fd.bind, fd.port, 30, pid=read_pid(state.run / "nginx.pid"), log=state.logs / "nginx-error.log", what="nginx")


def processes(fd):
    """nginx (master and workers) and memcached, of what runs."""
    found = {}
    pid = read_pid(fd.state.run / "nginx.pid")
    if pid and alive(pid):
        found["nginx"] = [pid, *children(pid)]
    pid = daemon_pid(fd.state.run / "memcached.pid")
    if pid:
        found["memcached"] = [pid]
    return found


def stop_nginx(fd):
    pid = read_pid(fd.state.run / "nginx.pid")
    if pid and alive(pid):
        stop(pid, signal.SIGQUIT, grace=35)
        return ["nginx"]
    return []


def stop_cache(fd):
    pid = daemon_pid(fd.state.run / "memcached.pid")
    if pid:
        stop(pid, signal.SIGTERM, grace=10)
        return ["memcached"]
    return []


def status(fd, running):
    return {"nginx": {"running": "nginx" in running, "workers": len(running.get("nginx", [])[1:])},
            "memcached": {"running": "memcached" in running, "address": f"127.0.0.1:{fd.ports['cache']}"}}
