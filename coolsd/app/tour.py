"""The explorer's guided tour, independent of Gradio: a few steps, each a setting of the controls and what to
look at. Every number and verdict a step cites is read from the shipped model's study (``bench_results.json``:
115 configurations x 1,000 images) when the app starts, so the texts cannot drift from the study; what the
study did not show is said plainly."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..models.bundle import DEFAULT_MODEL, file_digest
from .claims import QUALITY, claim_rows, indistinguishable_cool, resolved, shown
from .views import plain, shape_words

STUDY = DEFAULT_MODEL / "bench_results.json"
CHAIN, TREE, JACOBI = "chain:5", "tree:eagle25", "jacobi:16:coupled"
COOL2 = "cool:delta=2,nu=0.7,schedule=exp"
COOL = {"method": "COOL-SD", "delta": 2.0, "nu": 0.7, "mu_auto": True, "schedule": "exp"}


@dataclass(frozen=True)
class TourStep:
    """One step: its button's title, the control values it sets (by value name, ``session.value_names``),
    what to look at (``str.format`` fields name numbers of :func:`study_facts`), and whether it generates."""

    title: str
    values: dict
    text: str
    generate: bool = True


STEPS = (
    TourStep("1. Eagle-1 is lossless", {"method": "Eagle-1 (lossless)", "draft": CHAIN}, (
        "Eagle-1 keeps a drafted token with probability `min(1, p/q)` and resamples a rejection from "
        "`Norm([p - q]_+)`, so its images follow exactly the target's distribution: both images are the same "
        "run, and the relaxation cost is 0. In our study (1,000 images of {study_model}), AR minus Eagle-1 "
        "on chain:5 is {ar_ll} in log-likelihood per token, {ar_fid} in FID and {ar_acc} in class "
        "consistency: {ar_noise} (in the **Trade-off** tab, the grey band). Yet Eagle-1 emits {eagle_tau} "
        "tokens per target forward, {eagle_speedup} AR's speed.")),
    TourStep("2. Raise delta", {**COOL, "draft": CHAIN}, (
        "COOL-SD multiplies `p/q` by `omega_i = delta exp(-nu i - mu)` (the line under the sliders): it "
        "accepts more, faster, at a measured cost. At delta = 2 the study measured tau {cool_tau} against "
        "Eagle-1's {eagle_tau}, {cool_speedup} AR's speed against {eagle_speedup}, and a log-likelihood per "
        "token {cool_ll} from Eagle-1's (FID {cool_fid}). At delta = 1.1: {cool11_ll}. {cool_same} The "
        "**Theory** tab bounds the total-variation distance of one round under the current sliders: move "
        "delta and watch E[N] and the bound grow together.")),
    TourStep("3. Annealing or uniform?", {"method": "UniformRSD", "delta": 2.0, "draft": CHAIN}, (
        "UniformRSD relaxes every draft position by the same delta; COOL-SD with mu = auto spends the same "
        "total relaxation, more of it early. The paper finds annealing better; on our model the claim "
        "**{ann_verdict}**. At delta = 2 on chain:5, COOL-SD (nu = 0.7) minus UniformRSD is {ann_tau} in tau "
        "and {ann_gap} in the log-likelihood's distance from Eagle-1's (FID {ann_fid}). Over the study's "
        "{ann_pairs} such pairs, COOL-SD's FID was resolved better in {ann_fid_below} and worse in "
        "{ann_fid_above}, its log-likelihood closer to Eagle-1's in {ann_gap_below} and farther in "
        "{ann_gap_above}. Choose COOL-SD and Generate to compare the tables.")),
    TourStep("4. G* or the heuristic residual", {"method": "LANTERN++ with G*", "k": 5, "lambda": 2.0,
                                                 "draft": CHAIN}, (
        "LANTERN++ also accepts a draft by the target's mass on its nearest codes. After a rejection the "
        "published method clears `q` near the refused token (a heuristic); `G*` resamples from the exact "
        "residual. The paper finds `G*` better; on our model the claim **{res_verdict}**. At k = 5, "
        "lambda = 2 on chain:5, the heuristic minus `G*` is {res_fid} in FID and {res_tau} in tau. Over the "
        "study's {res_pairs} pairs, `G*`'s FID was resolved better in {res_fid_above} and worse in "
        "{res_fid_below}, and the heuristic had the resolved higher tau in {res_tau_above}. Choose LANTERN++ "
        "(the heuristic) and Generate to compare.")),
    TourStep("5. Chain or tree", {**COOL, "draft": TREE}, (
        "A tree drafts several candidates per position (Eagle-1's 25-node tree here), so more tokens pass per "
        "target forward: tau {eagle_tree_tau} for Eagle-1 on tree:eagle25 against {eagle_tau} on chain:5, "
        "{cool_tree_tau} against {cool_tau} for COOL-SD delta = 2. On the study's CPU that makes "
        "{eagle_tree_speedup} AR's speed for Eagle-1 (chain: {eagle_speedup}) and {cool_tree_speedup} for "
        "COOL-SD (chain: {cool_speedup}): {tree_words} On a GPU at batch 1 verification costs little more "
        "than one token and trees pay off, as in the paper. The **Theory** tab gives the numbers of a chain "
        "of the tree's depth.")),
    TourStep("6. No draft model", {"method": "Eagle-1 (lossless)", "draft": JACOBI}, (
        "A Jacobi window needs no draft model: the target drafts its next 16 tokens from its own last forward, "
        "and SCD's coupling keeps the drafts that still fit. Eagle-1's test keeps it lossless (it minus AR: "
        "{scd_ll} in log-likelihood per token). The study measured tau {scd_tau} and {scd_speedup} AR's speed "
        "(the draft model's chain:5: {eagle_tau}, {eagle_speedup}); COOL-SD delta = 2 on this window: tau "
        "{coolj_tau}, {coolj_speedup}. Over the whole study: a lossless drafter-free method faster than "
        "Eagle-1 **{lossless_verdict}**; a coupled refresh accepting more than an independent one (SCD over "
        "SJD) **{refresh_verdict}**; COOL-SD faster on the target's own drafts than on the draft model's "
        "**{relaxed_verdict}**; COOL-SD matching or beating GSD at equal tau **{gsd_verdict}**. The "
        "**Trade-off** tab shows these runs against AR, a panel per window length.")),
)
# A claim's verdict (coolsd.app.claims.verdict) in the tour's words
VERDICT_WORDS = {"holds": "holds", "reverses": "reverses", "mixed": "is mixed (its measures disagree)",
                 "not resolved": "is not resolved"}


def interval(difference: dict, digits: int) -> str:
    """A paired difference and its 95% interval, and whether the interval excludes 0 (resolved)."""
    return shown(difference, digits) + (" (resolved)" if resolved(difference) else " (not resolved)")


def resolved_count(differences: list[dict], measure: str, above: bool) -> int:
    """How many paired differences have their whole 95% interval above (or below) zero."""
    return sum(d[measure]["low"] > 0 if above else d[measure]["high"] < 0 for d in differences)


def run_facts(runs: dict, name: str, label: str, reference: str = "vs_eagle") -> dict[str, str]:
    """A run's tau, speed-up over AR and (for a relaxed one) its quality minus its reference's, as ``{name}_...``."""
    run = runs[label]
    facts = {f"{name}_tau": f"{run['tau']:.2f}", f"{name}_speedup": f"{run['speedup_vs_ar']:.2f}x"}
    for measure, key, digits in (("log_likelihood_per_token", "ll", 3), ("fid", "fid", 2),
                                 ("judge_accuracy", "acc", 3)):
        if measure in run.get(reference, {}):
            facts[f"{name}_{key}"] = interval(run[reference][measure], digits)
    return facts


def comparison_facts(study: dict, aspect: str, name: str, a: str, b: str) -> dict[str, str]:
    """One paired comparison (a minus b) of a claim, as ``{name}_tau`` etc., and how many of the claim's pairs
    are resolved above or below zero on each measure, as ``{name}_fid_above``, ``{name}_fid_below`` etc."""
    pairs = [c for c in study["comparisons"] if c["differs_in"] == aspect]
    chosen = next(c["a_minus_b"] for c in pairs if (c["a"], c["b"]) == (a, b))
    facts = {f"{name}_pairs": str(len(pairs)), f"{name}_tau": interval(chosen["tau"], 3),
             f"{name}_gap": interval(chosen["log_likelihood_gap"], 3), f"{name}_fid": interval(chosen["fid"], 2)}
    for measure, key in (("tau", "tau"), ("log_likelihood_gap", "gap"), ("fid", "fid")):
        for side in ("above", "below"):
            facts[f"{name}_{key}_{side}"] = str(resolved_count([c["a_minus_b"] for c in pairs], measure,
                                                               above=side == "above"))
    return facts


def verdict_facts(study: dict) -> dict[str, str]:
    """Each claim's verdict (:func:`coolsd.app.claims.claim_rows`) in words, as ``{name}_verdict``."""
    names = {"annealing": "ann", "residual": "res", "lossless_source": "lossless", "refresh": "refresh",
             "relaxed_source": "relaxed", ("cool", "gsd"): "gsd"}
    return {f"{names[claim.aspect or claim.families]}_verdict": VERDICT_WORDS[said]
            for claim, _, said in claim_rows(study) if (claim.aspect or claim.families) in names}


def noise_words(ar: dict) -> str:
    """What AR minus Eagle-1 says: every interval contains 0, as two exact samplers' must, or a fault."""
    quality = [ar.get("vs_eagle", {}).get(m) for m in QUALITY]
    if any(resolved(d) for d in quality if d):
        return "an interval excludes 0, which two exact samplers should not show: a fault to look into"
    return "every 95% interval contains 0, as it must for two exact samplers"


def cool_words(study: dict) -> str:
    """The strongest COOL-SD setting the study cannot tell from Eagle-1 on any quality measure, or that none is."""
    best = indistinguishable_cool(study)
    if best is None:
        return "No COOL-SD setting of the study is indistinguishable from Eagle-1 on every quality measure."
    return (f"The strongest COOL-SD setting the study cannot tell from Eagle-1 on any quality measure is "
            f"{best['label'].replace(' @ ', ' on ')} (tau {best['tau']:.2f}, {best['speedup_vs_ar']:.2f}x AR's speed).")


def study_model(study: dict, weights: Path = DEFAULT_MODEL / "target.safetensors") -> str:
    """Which model the study measured, in words: the shipped one, or (its recorded weights being other than the
    shipped ones) the earlier model it was made with, until the study is rerun."""
    recorded = study.get("target_sha256")
    if not recorded or not weights.is_file():
        return "the shipped model"
    stat = weights.stat()
    if file_digest(weights.resolve(), stat.st_size, stat.st_mtime_ns) == recorded:
        return "the shipped model"
    shape = study.get("model_shape")
    return (f"the previous default model{f' ({shape_words(shape)})' if shape else ''}: the study has not been "
            "rerun on the shipped one yet")


def study_facts(study: dict, weights: Path = DEFAULT_MODEL / "target.safetensors") -> dict[str, str]:
    """Every number the steps cite, read from a study's results (an absent one reads "(not in the study)"), and
    which model it measured (``study_model``, against the shipped ``weights``)."""
    facts: defaultdict[str, str] = defaultdict(lambda: "(not in the study)")
    facts["study_model"] = study_model(study, weights)
    runs = {run["label"]: run for run in study.get("runs", [])}

    def tree_words() -> str:
        slower = [runs[f"{m} @ {TREE}"]["speedup_vs_ar"] < runs[f"{m} @ {CHAIN}"]["speedup_vs_ar"]
                  for m in ("eagle", COOL2)]
        return ("verifying 25 nodes on a CPU costs much more than one token, so the tree is slower." if all(slower)
                else "the tree is faster for both." if not any(slower) else "the tree is faster for one of them only.")

    parts = [*(lambda name=name, label=label: run_facts(runs, name, label)
               for name, label in (("ar", "ar"), ("eagle", f"eagle @ {CHAIN}"), ("eagle_tree", f"eagle @ {TREE}"),
                                   ("cool", f"{COOL2} @ {CHAIN}"), ("cool_tree", f"{COOL2} @ {TREE}"),
                                   ("cool11", f"cool:delta=1.1,nu=0.7,schedule=exp @ {CHAIN}"))),
             lambda: run_facts(runs, "scd", f"eagle @ {JACOBI}", "vs_ar"),
             lambda: run_facts(runs, "coolj", f"cool:delta=2 @ {JACOBI}", "vs_ar"),
             lambda: comparison_facts(study, "annealing", "ann", f"{COOL2} @ {CHAIN}", f"uniform:delta=2 @ {CHAIN}"),
             lambda: comparison_facts(study, "residual", "res", f"lantern:k=5,lambda=2,residual=lantern @ {CHAIN}",
                                      f"lantern:k=5,lambda=2,residual=gstar @ {CHAIN}"),
             lambda: verdict_facts(study), lambda: {"ar_noise": noise_words(runs["ar"])},
             lambda: {"cool_same": cool_words(study)}, lambda: {"tree_words": tree_words()}]
    for part in parts:  # each on its own: a study without some runs still gives the others' numbers
        try:
            facts.update(part())
        except (KeyError, StopIteration, TypeError):
            pass  # the steps say which numbers the study lacks
    return facts


def read_study(path: Path = STUDY) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def step_text(step: TourStep, facts: dict[str, str]) -> str:
    """A step's text with the study's numbers filled in, under its title."""
    return f"**{plain(step.title)}**\n\n" + step.text.format_map(facts)
