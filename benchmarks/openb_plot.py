"""Plot GPU allocation against arrival for one openb trace (needs matplotlib).

    .venv/bin/python benchmarks/openb_plot.py --trace default --seeds 42-51 \
        --out docs/images/openb_default_allocation.png

Each curve is the protocol's column k for every k from 10 to 130, averaged over the seeds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean

from benchmarks.tracebench.cli import parse_seeds
from benchmarks.tracebench.simulate import run_seed
from benchmarks.tracebench.workload import read_nodes, read_pods

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"
POLICIES = "random,dotprod,gpu-clustering,gpu-packing,best-fit,fgd,default"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--trace", default="default")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--out", default="docs/images/openb_default_allocation.png")
    ap.add_argument("--replot", action="store_true", help="redraw from the .json beside --out")
    args = ap.parse_args()
    out = Path(args.out)
    if args.replot:
        saved = json.loads(out.with_suffix(".json").read_text())
        draw(tuple(saved["ks"]), saved["curves"], args, out)
        return
    pods = read_pods(f"{args.data}/openb_pod_list_{args.trace}.csv")
    nodes = read_nodes(f"{args.data}/openb_node_list_gpu_node.csv")
    ks = tuple(range(10, 131))
    curves = {}
    for policy in args.policies.split(","):
        runs = [run_seed(pods, nodes, policy, s, ks=ks) for s in parse_seeds(args.seeds)]
        curves[policy] = [
            fmean(v for r in runs if (v := r.columns[str(k)]) is not None) for k in ks
        ]
        print(policy, round(curves[policy][-1], 2), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"ks": ks, "curves": curves}))
    draw(ks, curves, args, out)


def draw(ks: tuple[int, ...], curves: dict[str, list[float]], args, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (full, zoom) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy, ys in curves.items():
        for ax in (full, zoom):
            style: dict[str, dict[str, object]] = {
                "default": {"lw": 2.5},
                "fgd": {"ls": "--", "lw": 1.5, "color": "black"},
            }
            ax.plot(ks, ys, label=policy, **style.get(policy, {"lw": 1}))
    full.plot(ks, ks, color="grey", ls=":", lw=1, label="arrived")
    full.set_ylim(0, 100)
    zoom.set_xlim(80, 130)
    zoom.set_ylim(80, 97)
    for ax in (full, zoom):
        ax.set_xlabel("arrived GPU request (% of capacity)")
        ax.set_ylabel("allocated GPU (% of capacity)")
        ax.grid(alpha=0.3)
    zoom.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"openb trace '{args.trace}', mean over seeds {args.seeds}")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
