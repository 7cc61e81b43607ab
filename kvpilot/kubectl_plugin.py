"""`kubectl kvpilot rollout status|watch|promote|abort|rollback|resume|pause NAME`: the rollout by hand.

Installed as the console script `kubectl-kvpilot`, so kubectl finds it as a plugin; also runs as
`python -m kvpilot.kubectl_plugin`. It talks to the API server with the current kubeconfig
($KUBECONFIG or ~/.kube/config, or --kubeconfig) and never to the operator directly: each command
is one patch the operator acts on (an annotation, or spec.canary.paused).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kvpilot.figures import figure
from kvpilot.operator import constants as c
from kvpilot.operator.options import ANNOTATION_ABORT, ANNOTATION_PROMOTE, ANNOTATION_ROLLBACK
from kvpilot.operator.rollout import phases

VERDICT_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
PHASE_STYLE = {phases.PROMOTED: "green", phases.ROLLED_BACK: "red", phases.FAILED: "red",
               phases.PAUSED: "yellow", phases.ROLLING_BACK: "red"}


class PluginError(RuntimeError):
    """A command that cannot be carried out; the message says why and what to do."""


def steps_line(steps: Sequence[int], step: int, weight: int, phase: str) -> Text:
    """`1% -> [5%] -> 100%`: the current step in brackets, passed ones green."""
    text = Text()
    for i, w in enumerate(steps):
        if i:
            text.append(" -> ")
        label = f"{w}%"
        if phase == phases.PROMOTED or i < step:
            text.append(label, "green")
        elif i == step and phase not in phases.DONE:
            text.append(f"[{label}]", "bold cyan")
        else:
            text.append(label, "dim")
    text.append(f"   (now {weight}% to canary)")
    return text


def analyses_table(analyses: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="Analyses", title_justify="left", expand=False)
    for col in ("#", "step", "weight", "verdict", "reason", "checks (canary / stable, limit)"):
        table.add_column(col)
    for i, a in enumerate(analyses):
        checks = Text()
        for check in a.get("checks") or ():
            ok = check.get("ok")
            mark, style = ("ok", "green") if ok else (("FAIL", "red") if ok is False else ("n/a", "yellow"))
            checks.append(f"{check.get('name')}: {figure(check.get('canary'))} / {figure(check.get('stable'))}, "
                          f"limit {figure(check.get('threshold'))} ", None)
            checks.append(mark, style)
            checks.append("\n")
        verdict = str(a.get("verdict", "?"))
        table.add_row(str(i), str(a.get("step", "")), f"{a.get('weight', '')}%",
                      Text(verdict, VERDICT_STYLE.get(verdict, "")), str(a.get("reason", "")),
                      checks if a.get("checks") else Text(str(a.get("message", ""))))
    return table


def lineage_table(lineage: Mapping[str, Any] | None) -> Table:
    table = Table(title="Lineage", title_justify="left")
    for col in ("track", "", "strategy", "model", "sha256"):
        table.add_column(col)
    data = (lineage or {}).get("data") or {}
    for track in ("stable", "canary"):
        raw = data.get(track)
        if not raw:
            continue
        entries = json.loads(raw)
        for which in ("current", "previous"):
            entry = entries.get(which)
            if entry:
                sha = entry.get("sha256") or "-"
                table.add_row(track, which, str(entry.get("strategy", "")), str(entry.get("uri", "")),
                              sha[:12] + ("..." if len(sha) > 12 else ""))
    return table


def render(obj: Mapping[str, Any], lineage: Mapping[str, Any] | None) -> Group:
    """The whole view of one InferenceService's rollout."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    canary = status.get("canary") or {}
    phase = canary.get("phase", phases.IDLE)
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("Name", f"{meta['namespace']}/{meta['name']}")
    head.add_row("Rollout", Text(phase, PHASE_STYLE.get(phase, "cyan")))
    head.add_row("Stable", f"{status.get('strategy', '?')} ({status.get('ready', '?')} ready)")
    if canary.get("strategy"):
        head.add_row("Canary", str(canary["strategy"]))
    steps = (spec.get("canary") or {}).get("steps") or [1, 5, 100]
    if spec.get("canary"):
        head.add_row("Steps", steps_line(steps, int(canary.get("step", -1)), int(canary.get("weight", 0)), phase))
        head.add_row("Failures", f"{canary.get('failures', 0)} of "
                     f"{((spec['canary'].get('analysis') or {}).get('failureLimit', 2))} allowed")
    if canary.get("message"):
        head.add_row("Message", f"{canary.get('reason', '')}: {canary['message']}")
    for cond in status.get("conditions") or ():
        if cond.get("type") in ("Canary", "TrafficSplit") and cond.get("status") == "False" \
                and cond.get("reason") not in (phase, "GatewayAPIReady"):
            head.add_row(cond["type"], Text(f"{cond.get('reason')}: {cond.get('message')}", "yellow"))
    parts: list[Any] = [head]
    if canary.get("analyses"):
        parts.append(analyses_table(canary["analyses"]))
    parts.append(lineage_table(lineage))
    return Group(*parts)


def patch_for(command: str, obj: Mapping[str, Any], clear: bool = False) -> dict[str, Any]:
    """The merge patch one command writes; refuses what would do nothing, saying why."""
    canary = (obj.get("status") or {}).get("canary") or {}
    phase, spec_hash = canary.get("phase", phases.IDLE), canary.get("specHash")
    name = obj["metadata"]["name"]
    if command == "rollback":
        return {"metadata": {"annotations": {ANNOTATION_ROLLBACK: None if clear else "true"}}}
    if command in ("resume", "pause"):
        if not (obj.get("spec") or {}).get("canary"):
            raise PluginError(f"{name} has no spec.canary: nothing to {command}")
        return {"spec": {"canary": {"paused": command == "pause"}}}
    if phase not in phases.ACTIVE or not spec_hash:
        raise PluginError(f"{name}: no rollout in progress (phase {phase}); `{command}` acts on a running canary")
    key = ANNOTATION_PROMOTE if command == "promote" else ANNOTATION_ABORT
    return {"metadata": {"annotations": {key: spec_hash}}}


def _kube(kubeconfig: str | None) -> Any:
    from kvpilot.operator.kube import Kube

    return Kube.from_environment(config_file=kubeconfig)


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    try:
        from kubernetes import config

        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        return str(active["context"].get("namespace") or "default")
    except Exception:
        return "default"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubectl kvpilot", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="group", required=True)
    rollout = sub.add_parser("rollout", help="watch and steer an InferenceService's canary rollout")
    rollout.add_argument("command", choices=["status", "watch", "promote", "abort", "rollback", "resume", "pause"])
    rollout.add_argument("name", help="InferenceService name")
    rollout.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    rollout.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    rollout.add_argument("--clear", action="store_true", help="rollback: remove the rollback annotation")
    rollout.add_argument("--interval", type=float, default=1.0, help="watch: seconds between refreshes")
    rollout.add_argument("--timeout", type=float, default=0, help="watch: give up after this many seconds (0: never)")
    args = parser.parse_args(argv)
    console = Console()
    try:
        return _run(args, console)
    except PluginError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # no kubeconfig, API server unreachable, refused: say which, no traceback
        console.print(f"[red]error:[/red] {_explain(exc)}")
        return 1


def _explain(exc: Exception) -> str:
    """A user's view of what went wrong talking to the cluster."""
    import httpx

    from kvpilot.operator.kube import KubeError

    kind = type(exc).__name__
    if kind == "ConfigException":
        return (f"no usable kubeconfig ({exc}); pass --kubeconfig FILE, set $KUBECONFIG, "
                "or run `eval \"$(kvpilot cluster env)\"` for the local cluster")
    if isinstance(exc, httpx.TransportError):
        return f"cannot reach the API server ({kind}: {exc}); is the cluster up and the kubeconfig's server right?"
    if isinstance(exc, KubeError):
        if exc.status == 404:
            return f"{exc}: is the InferenceService CRD installed (crds/ or the Helm chart)?"
        if exc.status in (401, 403):
            return f"{exc}: your credentials may not read or patch inferenceservices in this namespace"
        return str(exc)
    return f"{kind}: {exc}"


def _run(args: argparse.Namespace, console: Console) -> int:
    from kvpilot.operator.kube import object_path

    kube = _kube(args.kubeconfig)
    namespace = _namespace(args)
    path = object_path(c.API_VERSION, c.KIND, namespace, args.name)

    def fetch() -> tuple[dict[str, Any], dict[str, Any] | None]:
        obj = kube.get(path)
        if obj is None:
            raise PluginError(f"InferenceService {namespace}/{args.name} not found")
        return obj, kube.get(object_path("v1", "ConfigMap", namespace, f"{args.name}-lineage"))

    if args.command == "status":
        console.print(render(*fetch()))
        return 0
    if args.command == "watch":
        deadline = time.monotonic() + args.timeout if args.timeout else None
        with Live(render(*fetch()), console=console, refresh_per_second=4) as live:
            while True:
                obj, lineage = fetch()
                live.update(render(obj, lineage))
                phase = ((obj.get("status") or {}).get("canary") or {}).get("phase", phases.IDLE)
                if phase in phases.DONE or (deadline and time.monotonic() > deadline):
                    return 0 if phase in (phases.PROMOTED, phases.IDLE) else 1
                time.sleep(args.interval)
    obj, _ = fetch()
    kube.merge_patch(path, patch_for(args.command, obj, clear=args.clear))
    console.print(f"{namespace}/{args.name}: {args.command}{' --clear' if args.clear else ''} requested")
    return 0


if __name__ == "__main__":
    sys.exit(main())
