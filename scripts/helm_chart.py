#!/usr/bin/env python3
"""Helm itself, through helm-sdkpy (PyPI; its wheel carries Helm's Go
library), for the tests of deploy/helm. Python 3.11 runs it:
helm-sdkpy declares >= 3.12 but is installed with
`pip install --ignore-requires-python` (scripts/test.sh).

  helm_chart.py lint CHART [VALUES.json]
      Helm's lint of CHART, or of a copy whose values.yaml is VALUES
      (complete values: helm-sdkpy's lint takes none).
      Prints {"messages": [{"severity": "INFO|WARNING|ERROR", "path": ...}]}.
  helm_chart.py render CHART RELEASE NAMESPACE [VALUES.json]
      Helm's install of CHART with VALUES, against a loopback test double of
      the API server (helm-sdkpy has no dry run): Helm renders the chart,
      maps every object to an API resource through discovery and creates
      it. Prints {"manifest": <what Helm rendered>, "created": [objects]}.

Exit 0 with the JSON on stdout; 1 with a one-line error on stderr.
"""

import asyncio
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading

# The resources the double serves: (group, version, kind, plural, namespaced).
# An object of any other kind fails the install ("no matches for kind"), as
# on a cluster without it. ServiceMonitor is prometheus-operator's CRD.
RESOURCES = [
    ("", "v1", "Namespace", "namespaces", False),
    ("", "v1", "ConfigMap", "configmaps", True),
    ("", "v1", "Service", "services", True),
    ("", "v1", "ServiceAccount", "serviceaccounts", True),
    ("apps", "v1", "DaemonSet", "daemonsets", True),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", False),
    ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", True),
]

SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


def die(msg):
    print(f"helm_chart.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load_values(path):
    if path is None:
        return None
    with open(path) as f:
        return json.load(f)


def lint(chart, values):
    import helm_sdkpy

    with tempfile.TemporaryDirectory() as tmp:
        if values is not None:
            # helm-sdkpy's lint takes no values: lint a copy whose values.yaml
            # is VALUES (JSON is YAML).
            copy_dir = os.path.join(tmp, os.path.basename(os.path.abspath(chart)))
            shutil.copytree(chart, copy_dir)
            with open(os.path.join(copy_dir, "values.yaml"), "w") as f:
                json.dump(values, f, indent=1)
            chart = copy_dir
        res = asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(chart))
    # Helm's messages carry their error as a Go error, which helm-sdkpy's
    # JSON drops: the severity and the file are what is left.
    return {
        "messages": [
            {"severity": SEVERITY.get(m.get("Severity"), str(m.get("Severity"))), "path": m.get("Path")}
            for m in res.get("Messages") or []
        ],
        "errors": len(res.get("Errors") or []),
    }


class FakeApiServer(http.server.ThreadingHTTPServer):
    """A test double of kube-apiserver for one Helm install: version and
    discovery of RESOURCES, 404 for every object (none exists yet), and
    creation that records the object. Loopback only."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.created = []
        self.lock = threading.Lock()

    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


def _gv_path(group, version):
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code, reason, message):
        self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": reason, "message": message, "code": code})

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/version":
            return self._reply(200, {"major": "1", "minor": "36", "gitVersion": "v1.36.0",
                                     "platform": "linux/amd64"})
        if path == "/api":
            return self._reply(200, {"kind": "APIVersions", "versions": ["v1"],
                                     "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = {}
            for g, v, *_ in RESOURCES:
                if g and v not in groups.setdefault(g, []):
                    groups[g].append(v)
            return self._reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g,
                 "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in groups.items()]})
        for g, v in {(g, v) for g, v, *_ in RESOURCES}:
            if path == _gv_path(g, v):
                return self._reply(200, {
                    "kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": f"{g}/{v}" if g else v,
                    "resources": [
                        {"name": plural, "singularName": kind.lower(), "namespaced": ns,
                         "kind": kind,
                         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                        for rg, rv, kind, plural, ns in RESOURCES if (rg, rv) == (g, v)]})
        self._status(404, "NotFound", f"{path} not found")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            obj = json.loads(body)
        except ValueError:
            return self._status(415, "UnsupportedMediaType", "the double takes JSON only")
        with self.server.lock:
            self.server.created.append(obj)
        self._reply(201, obj)


def render(chart, release, namespace, values):
    import helm_sdkpy

    server = FakeApiServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "double", "cluster": {"server": server.url()}}],
        "users": [{"name": "double", "user": {"token": "test-double"}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double"}}],
        "current-context": "double",
    })
    try:
        # helm-sdkpy takes a kubeconfig as a path or as YAML text (JSON is
        # YAML, but it recognises text by its keys, so a file is surer).
        with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as kc:
            kc.write(kubeconfig)
            kc.flush()
            config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kc.name)
            rel = asyncio.run(helm_sdkpy.Install(config).run(
                release, chart, values=values, wait=False, timeout=60))
    finally:
        server.shutdown()
    return {"manifest": rel.get("manifest", ""), "created": server.created}


def main(argv):
    # Helm keeps its release record in Secrets unless told otherwise; the
    # double keeps none. Helm's Go library reads the variable once, at load.
    if os.environ.get("HELM_DRIVER") != "memory":
        os.environ["HELM_DRIVER"] = "memory"
        os.execv(sys.executable, [sys.executable] + argv)
    try:
        if len(argv) in (2, 3) and argv[1] == "lint":
            out = lint(argv[2] if len(argv) > 2 else die("lint: no chart"), None)
        elif len(argv) == 4 and argv[1] == "lint":
            out = lint(argv[2], load_values(argv[3]))
        elif len(argv) in (5, 6) and argv[1] == "render":
            out = render(argv[2], argv[3], argv[4], load_values(argv[5]) if len(argv) > 5 else None)
        else:
            die("usage: helm_chart.py lint CHART [VALUES.json] | render CHART RELEASE NAMESPACE [VALUES.json]")
    except Exception as e:  # one line naming what Helm said
        die(f"{argv[1]} {argv[2]}: {type(e).__name__}: {' '.join(str(e).split())}")
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main(sys.argv)
