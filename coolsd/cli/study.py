"""The benchmark as a study: configurations (a method on a draft) times images as work items, records that a
rerun continues from, the split of the items over torch.distributed processes and their merge on rank 0.
What is generated and how it is summarised stays in :mod:`coolsd.cli.passes` and :mod:`coolsd.cli.summaries`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..core.decode import EMPTY
from ..core.params import shorten
from ..core.rules import RULES
from ..core.trees import DraftTree, parse_draft
from ..models.bundle import pick_device
from .methods import check_rule, method_label, parse_method, preset_methods

ARGUMENTS_FILE = "arguments.json"
# A process that finished its share waits in the gather for the slowest one; torch's default of 30 minutes
# would end a long study there.
GATHER_TIMEOUT = timedelta(days=2)


@dataclass(frozen=True)
class Configuration:
    """A method with its parameters on a draft tree (:data:`EMPTY` for a method that drafts nothing: AR)."""

    name: str
    params: dict
    tree: DraftTree
    label: str
    drafter: str | None = None  # the model's drafter it drafts with (None: the model's default, or none needed)

    @property
    def draft(self) -> str:
        return self.tree.name if self.tree.size else "none"


@dataclass(frozen=True)
class Study:
    """What a benchmark measures: every configuration on images 0..images-1 (image i: condition i mod C, seed
    ``seed + i``); images 0..latency_images-1 are also timed, ``repeats`` times each, after ``warmup`` untimed
    calls per configuration. ``skipped``: what a preset offered but the rule refuses here, with the reason.
    ``batch``: images decoded together in the untimed pass (the same tokens as one at a time up to
    rounding, spec section 9);
    ``latency_batches``: the batch sizes the timed images are decoded in, each timed separately."""

    configurations: tuple[Configuration, ...]
    images: int
    seed: int = 0
    latency_images: int | None = None  # None: every image
    repeats: int = 1
    warmup: int = 2
    skipped: tuple[dict, ...] = ()
    batch: int = 1
    latency_batches: tuple[int, ...] = (1,)

    @property
    def timed_images(self) -> int:
        return self.images if self.latency_images is None else self.latency_images

    @property
    def drafts(self) -> list[str]:
        """The draft trees in play, in order of appearance."""
        return list(dict.fromkeys(c.draft for c in self.configurations if c.tree.size))

    def items(self) -> list[tuple[int, int]]:
        """(configuration, image) pairs, image-major, so that any process's share interleaves configurations."""
        return [(c, i) for i in range(self.images) for c in range(len(self.configurations))]


def plan(methods: list[str], presets: list[str], draft: str, max_depth: int, vocab_size: int,
         drafters: list[str] | None = None) -> tuple[list[Configuration], list[dict]]:
    """The configurations to run, in order (AR first unless listed; then ``methods`` on ``draft``; then each
    preset's), and those a preset offers that the rule refuses here (a too steep linear ``nu`` for the depth, a
    ``k`` beyond the vocabulary) with the reason. A refused or repeated ``methods`` spec is an error; a preset's
    repeat of something already planned is dropped. Labels name the draft when several drafts are in play.
    ``drafters`` (names): each configuration that needs a drafter runs once with each, its label naming one
    other than Eagle-1."""
    wanted = [(spec, draft, False) for spec in methods]
    wanted += [(spec, preset_draft, True) for preset in presets for spec, preset_draft in preset_methods(preset, draft)]
    if not any(parse_method(spec)[0] == "ar" for spec, _, _ in wanted):
        wanted.insert(0, ("ar", draft, False))
    planned: dict[tuple[str, str], tuple[str, dict, DraftTree]] = {}
    skipped, refused = [], set()
    for spec, draft_spec, from_preset in wanted:
        name, params = parse_method(spec)
        tree = parse_draft(draft_spec, max_depth) if RULES[name].drafts else EMPTY
        key = (method_label(name, params), tree.name)
        if key in planned or key in refused:
            if from_preset:
                continue
            raise ValueError(f"method {key[0]} is listed twice")
        try:
            check_rule(name, params, tree.depth, vocab_size)
        except ValueError as error:
            if not from_preset:
                raise
            skipped.append({"label": key[0], "draft": tree.name, "reason": str(error)})
            refused.add(key)
            continue
        planned[key] = (name, params, tree)
    several = len({tree.name for _, _, tree in planned.values() if tree.size}) > 1
    return [Configuration(name, params, tree, configuration_label(name, params, tree, several, drafter), drafter)
            for name, params, tree in planned.values()
            for drafter in (drafters or [None] if tree.size and tree.needs_drafter else [None])], skipped


def configuration_label(name: str, params: dict, tree: DraftTree, several_drafts: bool,
                        drafter: str | None = None) -> str:
    """The method spec, followed by the draft when several are in play (never for AR: it drafts nothing), and by
    the drafter when it is not Eagle-1."""
    return (method_label(name, params) + (f" @ {tree.name}" if several_drafts and tree.size else "")
            + (f" [{drafter}]" if drafter not in (None, "eagle1") else ""))


# Records ------------------------------------------------------------------------------------------------------
def record_key(record: dict) -> tuple[str, str, int, int]:
    """A record is a ``sample`` (tokens and quality of a (configuration, image)) or a ``timing`` (its latency
    when decoded in a batch of ``batch`` images; records without the field are of batch 1)."""
    return record["kind"], record["configuration"], record["image"], record.get("batch", 1)


def read_records(path: Path) -> list[dict]:
    """The complete lines of a record file (a line cut short by a crash is left out: its item is redone)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class Records:
    """Finished records by (kind, configuration, image, batch). With a folder, each new one is appended to this
    process's ``records-<rank>.jsonl`` as soon as it is done, and a rerun starts from every record file there
    (whatever the number of processes that wrote them)."""

    def __init__(self, folder: Path | None = None, rank: int = 0) -> None:
        self.by_key: dict[tuple[str, str, int, int], dict] = {}
        self.path = folder / f"records-{rank}.jsonl" if folder is not None else None
        for path in sorted(folder.glob("records-*.jsonl")) if folder is not None else []:
            for record in read_records(path):
                self.by_key.setdefault(record_key(record), record)
        if self.path is not None and self.path.exists() and not self.path.read_bytes().endswith(b"\n"):
            with self.path.open("a") as file:  # end a line cut short, so the next record starts its own
                file.write("\n")

    def get(self, kind: str, label: str, image: int, batch: int = 1) -> dict | None:
        return self.by_key.get((kind, label, image, batch))

    def add(self, record: dict, save: bool = True) -> None:
        self.by_key[record_key(record)] = record
        if save and self.path is not None:
            with self.path.open("a") as file:
                file.write(json.dumps(record) + "\n")


def check_work(folder: Path | None) -> None:
    """``--work``: a folder that exists or can be made (its parent exists), and can be written."""
    if folder is None:
        return
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--work {folder} is a file; give a folder")
    if not folder.exists() and not folder.parent.is_dir():
        raise ValueError(f"--work {folder}: folder {folder.parent} does not exist")
    if not os.access(folder if folder.exists() else folder.parent, os.W_OK):
        raise ValueError(f"--work {folder}: not writable")


def open_work(folder: Path | None, arguments: dict, rank: int = 0) -> None:
    """Make ``folder`` this study's: store the arguments its records depend on, or refuse if it holds the
    records of other arguments (mixing them would summarise two studies as one)."""
    if folder is None:
        return
    folder.mkdir(exist_ok=True)
    path = folder / ARGUMENTS_FILE
    arguments = json.loads(json.dumps(arguments))  # tuples as lists, as they read back
    if path.exists():
        stored = json.loads(path.read_text())
        differ = [key for key in sorted(set(stored) | set(arguments)) if stored.get(key) != arguments.get(key)]
        if differ:
            shown = "; ".join(f"{key}: {shorten(stored.get(key), 30)} there, {shorten(arguments.get(key), 30)} here"
                              for key in differ[:3])
            raise ValueError(f"--work {folder} holds the records of other arguments ({shown}); rerun with the "
                             "same arguments to resume, or give another folder")
        return
    temporary = folder / f".{ARGUMENTS_FILE}.{rank}"  # every process may write it: each its own, then a rename
    temporary.write_text(json.dumps(arguments, indent=1) + "\n")
    temporary.replace(path)


# Sharding over torch.distributed -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """This process among the benchmark's processes (torchrun's RANK of WORLD_SIZE; rank 0 of 1 without it)."""

    rank: int = 0
    world: int = 1

    def share(self, items: list) -> list:
        """The items whose index modulo the number of processes is this rank."""
        return items[self.rank::self.world]


def shard_from_environment() -> Shard:
    return Shard(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))


def shard_device(device: str | None, shard: Shard) -> str | None:
    """Under torchrun on CUDA each process takes its own GPU (LOCAL_RANK), unless ``--device`` names one."""
    if shard.world == 1 or pick_device(device).type != "cuda" or (device and ":" in device):
        return device
    return f"cuda:{os.environ.get('LOCAL_RANK', str(shard.rank))}"


def join(shard: Shard, device: torch.device) -> None:
    """Join the process group: gloo between CPU processes, nccl between GPUs."""
    if shard.world == 1:
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=GATHER_TIMEOUT)


def gather(records: list[dict], shard: Shard, everyone: bool = False, last: bool = True) -> list[dict] | None:
    """Every process's records on rank 0 (None elsewhere), or on every process (``everyone``). The group ends
    here unless more collectives follow (``last`` False): what follows runs without any process waiting on one."""
    if shard.world == 1:
        return records
    if everyone:
        received = [None] * shard.world
        dist.all_gather_object(received, records)
    else:
        received = [None] * shard.world if shard.rank == 0 else None
        dist.gather_object(records, received, dst=0)
    if last:
        dist.barrier()
        dist.destroy_process_group()
    return [record for part in received for record in part] if received is not None else None


def merge(records: list[dict], study: Study) -> list[dict]:
    """The gathered samples sorted by (configuration, image); exactly one per item, or a shard lost work."""
    order = {c.label: k for k, c in enumerate(study.configurations)}
    merged = sorted(records, key=lambda r: (order[r["configuration"]], r["image"]))
    found = [(order[r["configuration"]], r["image"]) for r in merged]
    expected = sorted(study.items())
    if found != expected:
        missing, extra = sorted(set(expected) - set(found)), len(found) - len(set(found))
        raise RuntimeError(f"the shards returned {len(found)} samples for {len(expected)} items: "
                           f"{len(missing)} missing (first {missing[:3]}), {extra} duplicated")
    return merged
