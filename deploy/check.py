#!/usr/bin/env python3
"""Checks deploy/ offline, as far as this machine allows, and against the tern binary:

- the systemd units pass `systemd-analyze verify` with no warning (ExecStart pointed at the
  binary under test), and `systemd-analyze security --offline` rates each at most 2.5 ("OK");
- every example flagfile, every compose command and every Kubernetes container's command line
  (the ConfigMap's flagfiles included) passes `tern CMD ... --check_flags`;
- the Kubernetes objects are well formed: each has apiVersion, kind and a name; each Service
  selects some pod template; each probe's port is one the container declares; each ConfigMap and
  PersistentVolumeClaim a pod mounts exists, each `tern health` probe's flags are good; and
  `kubectl kustomize` renders them where kubectl is installed.

Usage: /usr/bin/python3 deploy/check.py TERN_BINARY     (exit 0: all good)
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what)


# The daemons' state directory on a deploy host. `tern server --check_flags` checks that it can
# write in its --checkpoint's directory, so the checks run with it under a scratch root.
STATE = "/var/lib/tern"


def under_scratch(text, scratch):
    """`text` with every path under STATE moved under `scratch` (made, with its directories)."""
    for m in re.finditer(re.escape(STATE) + r"[^\s\"']*", text):
        os.makedirs(os.path.dirname(scratch + m.group(0)), exist_ok=True)
    return text.replace(STATE, scratch + STATE)


def check_flags(tern, argv, flagfiles_dir=None, where=""):
    """Runs `tern ARGV --check_flags`; ARGV[0] is the command. Paths under /var/lib/tern (the
    host's state directory, which the units, compose volumes and manifests provide) are checked
    under a scratch root."""
    scratch = tempfile.mkdtemp(prefix="tern-deploy-check-")
    args = []
    for a in argv:
        if flagfiles_dir and a.startswith("--flagfile=/etc/tern/"):
            a = "--flagfile=" + os.path.join(flagfiles_dir, os.path.basename(a.split("=", 1)[1]))
        if a.startswith("--flagfile="):
            copy = os.path.join(scratch, os.path.basename(a.split("=", 1)[1]))
            with open(a.split("=", 1)[1]) as f, open(copy, "w") as out:
                out.write(under_scratch(f.read(), scratch))
            a = "--flagfile=" + copy
        args.append(under_scratch(a, scratch))
    r = subprocess.run([tern] + args + ["--check_flags"], capture_output=True, text=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if r.returncode != 0:
        fail(f"{where}: tern {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    else:
        print(f"ok: {where}: tern {args[0]}")


def check_units(tern):
    if shutil.which("systemd-analyze") is None:
        print("skip: systemd-analyze is not installed")
        return
    with tempfile.TemporaryDirectory() as d:
        units = []
        for name in sorted(os.listdir(os.path.join(HERE, "systemd"))):
            if not name.endswith(".service"):
                continue
            text = open(os.path.join(HERE, "systemd", name)).read()
            path = os.path.join(d, name)
            open(path, "w").write(text.replace("/usr/bin/tern", os.path.abspath(tern)))
            units.append(path)
            m = re.search(r"--flagfile=(\S+)", text)
            check_flags(tern, [text.split("/usr/bin/tern ")[1].split()[0], "--flagfile=" + m.group(1)],
                        os.path.join(HERE, "etc"), f"systemd/{name}")
        r = subprocess.run(["systemd-analyze", "verify"] + units, capture_output=True, text=True)
        said = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or said:
            fail(f"systemd-analyze verify: {said}")
        else:
            print(f"ok: systemd-analyze verify: {len(units)} units, no warning")
        for u in units:
            r = subprocess.run(["systemd-analyze", "security", "--offline=yes", u],
                               capture_output=True, text=True)
            m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
            if not m or float(m.group(1)) > 2.5:
                fail(f"systemd-analyze security {os.path.basename(u)}: "
                     f"{m.group(0) if m else r.stderr.strip()}")
            else:
                print(f"ok: {m.group(0)}")


def check_compose(tern):
    doc = yaml.safe_load(open(os.path.join(HERE, "compose", "compose.yaml")))
    for name, svc in doc["services"].items():
        cmd = svc.get("command")
        if not cmd:
            fail(f"compose service {name}: no command")
            continue
        if svc.get("entrypoint") == ["sh", "-c"]:  # "tern CMD ... && more": the tern part
            cmd = shlex.split(cmd[0].split("&&")[0])
            cmd = cmd[1:] if cmd[:1] == ["tern"] else cmd
        check_flags(tern, [str(c) for c in cmd], where=f"compose/{name}")


def pod_specs(obj):
    kind = obj["kind"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [obj["spec"]["template"]]
    return []


def check_k8s(tern):
    docs = []
    for name in sorted(os.listdir(os.path.join(HERE, "k8s"))):
        if name.endswith(".yaml") and name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(open(os.path.join(HERE, "k8s", name))) if d]
    for d in docs:
        if not d.get("apiVersion") or not d.get("kind") or not d.get("metadata", {}).get("name"):
            fail(f"k8s object without apiVersion, kind or name: {d}")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    templates = [t for d in docs for t in pod_specs(d)]
    with tempfile.TemporaryDirectory() as flags_dir:
        for d in docs:
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tern-flags":
                for f, text in d["data"].items():
                    open(os.path.join(flags_dir, f), "w").write(text)
        for d in docs:
            for t in pod_specs(d):
                check_pod(tern, d, t, names, flags_dir)
    for d in docs:
        if d["kind"] == "Service":
            sel = d["spec"]["selector"]
            if not any(all(t["metadata"]["labels"].get(k) == v for k, v in sel.items())
                       for t in templates):
                fail(f"Service {d['metadata']['name']} selects no pod template")
    if shutil.which("kubectl"):
        r = subprocess.run(["kubectl", "kustomize", os.path.join(HERE, "k8s")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"kubectl kustomize: {r.stderr.strip()}")
        else:
            print(f"ok: kubectl kustomize renders {r.stdout.count('kind:')} objects")
    else:
        print("skip: kubectl is not installed (kustomize rendering)")


def check_pod(tern, obj, template, names, flags_dir):
    spec = template["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for v in volumes.values():
        if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) not in names:
            fail(f"{obj['metadata']['name']}: ConfigMap {v['configMap']['name']} does not exist")
        pvc = v.get("persistentVolumeClaim", {}).get("claimName")
        if pvc and ("PersistentVolumeClaim", pvc) not in names:
            fail(f"{obj['metadata']['name']}: PersistentVolumeClaim {pvc} does not exist")
    for c in spec["containers"]:
        where = f"k8s/{obj['metadata']['name']}/{c['name']}"
        ports = {p["containerPort"] for p in c.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            p = c.get(probe, {}).get("grpc")
            if p and p["port"] not in ports:
                fail(f"{where}: {probe} on port {p['port']}, not a container port")
            e = c.get(probe, {}).get("exec", {}).get("command", [])
            if e[:2] == ["sh", "-c"]:  # tern health ...: its flags, and a declared port
                argv = shlex.split(e[2].replace("${HOSTNAME}", "pod-0"))[1:]
                check_flags(tern, argv, where=f"{where} {probe}")
                m = re.search(r"--target=[^:]+:(\d+)", e[2])
                if not m or int(m.group(1)) not in ports:
                    fail(f"{where}: {probe} asks a port the container does not declare")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                fail(f"{where}: mounts unknown volume {m['name']}")
        argv = c.get("args", [])
        if c.get("command") == ["sh", "-c"]:
            line = argv[0].replace("${HOSTNAME##*-}", "0").replace("${HOSTNAME}", "pod-0")
            argv = shlex.split(line)
            argv = argv[2:] if argv[:2] == ["exec", "tern"] else argv
        check_flags(tern, [str(a) for a in argv], flags_dir, where)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tern = sys.argv[1]
    for f in ("worker", "server", "scheduler"):
        check_flags(tern, [f, f"--flagfile={HERE}/etc/{f}.flags"], where=f"etc/{f}.flags")
    check_units(tern)
    check_compose(tern)
    check_k8s(tern)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
