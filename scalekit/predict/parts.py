"""Named hardware parts, each figure with its public source: `part("H100-SXM")`, `gpus("8xH100-SXM")`.

Every FLOP/s figure is the DENSE peak.  Vendors print sparse figures (2:4 structured sparsity) beside them, twice
as large, often with an asterisk: those are wrong for training and inference of dense models and are not used
here (each source string says which column was read).  Bandwidths are per GPU and per direction: NVLink's
"900 GB/s" for H100 is both directions added, 450 GB/s each way, and the α-β model needs one way.

A user's part joins the table with `register(Part(...))`.  "this-cpu" is measured, not looked up: it exists once
`scalekit.calibrate()` has run (see predict/calibrate.py); "this-gpu" once `scalekit.calibrate(device="cuda")` has.
`datasheet_part(torch.cuda.get_device_name())` is the table's part a GPU's name is, where it is one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from ..errors import ConfigError

GB = 1e9
TFLOPS = 1e12
GPUS_PER_NODE = 8  # "8xH100-SXM" is one HGX/DGX node; more GPUs than this span nodes of 8 unless told otherwise


@dataclass(frozen=True)
class Part:
    """One accelerator: dense peaks per dtype (FLOP/s), memory, and the links one GPU has to the others."""

    name: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s: 'fp32', 'tf32', 'bf16', 'fp16', 'fp8' where it exists
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    intra_link: str  # e.g. "NVLink 4", "PCIe Gen5 x16"
    intra_bandwidth: float  # bytes/s per GPU, one direction, to the other GPUs of its node
    inter_link: str  # e.g. "InfiniBand NDR 400 Gb/s per GPU"
    inter_bandwidth: float  # bytes/s per GPU, one direction, to other nodes
    sources: dict[str, str] = field(default_factory=dict)  # figure -> where it comes from
    efficiency: object | None = None  # measured factors (cost.Efficiency) for a calibrated part, else None

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ConfigError(f"{self.name} has no {dtype} peak in the parts table; it has "
                              f"{', '.join(self.peak_flops)}")
        return self.peak_flops[dtype]


def _gpu(name, fp32, tf32, bf16, fp8, mem_gb, bw_gbs, intra_link, intra_gbs, inter_link, inter_gbs, **sources) -> Part:
    flops = {"fp32": fp32 * TFLOPS, "tf32": tf32 * TFLOPS, "bf16": bf16 * TFLOPS, "fp16": bf16 * TFLOPS}
    if fp8:
        flops["fp8"] = fp8 * TFLOPS
    return Part(name, flops, mem_gb * GB, bw_gbs * GB, intra_link, intra_gbs * GB, inter_link, inter_gbs * GB, sources)


A100_SHEET = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
              "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS "
              "dense (the 312/624 sparse figures not used)")
H100_SHEET = ("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/): SXM FP32 67, TF32 989*, "
              "BF16 1,979*, FP8 3,958* TFLOPS where * is with sparsity: dense is half (494.7, 989.4, 1,978.9); PCIe "
              "FP32 51, TF32 756*, BF16 1,513*, FP8 3,026* (dense 378, 756, 1,513); NVL FP32 60, TF32 835*, BF16 "
              "1,671*, FP8 3,341* (dense 417.5, 835.5, 1,670.5)")
H200_SHEET = ("NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/): compute as H100 SXM (sparse figures "
              "halved), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s")
B200_SHEET = ("NVIDIA HGX B200 / DGX B200 datasheet (nvidia.com/en-us/data-center/hgx/): per GPU FP8 9 PFLOPS*, "
              "BF16 4.5 PFLOPS*, TF32 2.2 PFLOPS* with sparsity (dense 4.5, 2.25, 1.1), FP32 75 TFLOPS; 180 GB "
              "HBM3e (1,440 GB per 8-GPU system) at 7.7 TB/s; NVLink 5 1.8 TB/s")
ADA_SHEET = ("NVIDIA Ada Lovelace architecture whitepaper (v2.1), appendix tables: L40S FP32 91.6, TF32 183*, BF16 "
             "362*, FP8 733* TFLOPS (dense; the 366/733/1,466 sparse figures not used), 48 GB GDDR6 at 864 GB/s; "
             "RTX 4090 FP32 82.6, TF32 82.6, FP16/BF16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3 "
             "(dense), 24 GB GDDR6X at 1,008 GB/s")
NVLINK3 = "NVLink 3: 600 GB/s per GPU both directions (A100 datasheet), 300 GB/s each way"
NVLINK4 = "NVLink 4: 900 GB/s per GPU both directions (H100 datasheet), 450 GB/s each way"
NVLINK5 = "NVLink 5: 1.8 TB/s per GPU both directions (HGX B200 datasheet), 900 GB/s each way"
IB_HDR = "one 200 Gb/s HDR InfiniBand NIC per GPU as in DGX A100 (DGX A100 user guide: 8× ConnectX-6): 25 GB/s"
IB_NDR = "one 400 Gb/s NDR InfiniBand NIC per GPU as in DGX H100/H200/B200 (8× ConnectX-7): 50 GB/s"
ETH_ASSUMED = "assumed: one 100 Gb/s Ethernet (RoCE) NIC per GPU, typical of PCIe servers (no vendor reference design)"

PARTS: dict[str, Part] = {}


def register(part: Part) -> Part:
    """Add (or replace) a part in the table; `gpus("4xMY-PART")` then finds it."""
    if not isinstance(part, Part):
        raise ConfigError(f"scalekit.predict.register: give a Part, got {type(part).__name__}")
    PARTS[part.name] = part
    return part


for _p in (
    _gpu("A100-40GB-SXM", 19.5, 156, 312, None, 40, 1555, "NVLink 3", 300, "InfiniBand HDR 200 Gb/s", 25,
         flops=A100_SHEET, memory="A100 datasheet: 40 GB HBM2 at 1,555 GB/s", intra=NVLINK3, inter=IB_HDR),
    _gpu("A100-80GB-SXM", 19.5, 156, 312, None, 80, 2039, "NVLink 3", 300, "InfiniBand HDR 200 Gb/s", 25,
         flops=A100_SHEET, memory="A100 datasheet: 80 GB HBM2e at 2,039 GB/s", intra=NVLINK3, inter=IB_HDR),
    _gpu("H100-SXM", 67, 494.7, 989.4, 1978.9, 80, 3350, "NVLink 4", 450, "InfiniBand NDR 400 Gb/s", 50,
         flops=H100_SHEET, memory="H100 datasheet: SXM 80 GB HBM3 at 3.35 TB/s", intra=NVLINK4, inter=IB_NDR),
    _gpu("H100-PCIe", 51, 378, 756, 1513, 80, 2000, "PCIe Gen5 x16", 64, "Ethernet 100 Gb/s", 12.5,
         flops=H100_SHEET, memory="H100 datasheet: PCIe 80 GB HBM2e at 2 TB/s",
         intra="PCIe Gen5 x16: 128 GB/s both directions, 64 GB/s each way (the optional NVLink bridge pairs two "
               "cards only and is not modelled)", inter=ETH_ASSUMED),
    _gpu("H100-NVL", 60, 417.5, 835.5, 1670.5, 94, 3900, "PCIe Gen5 x16", 64, "Ethernet 100 Gb/s", 12.5,
         flops=H100_SHEET, memory="H100 datasheet: NVL 94 GB HBM3 at 3.9 TB/s, 350-400 W",
         intra="PCIe Gen5 x16: 128 GB/s both directions, 64 GB/s each way (the NVLink bridge, 600 GB/s, pairs two "
               "cards only and is not modelled)", inter=ETH_ASSUMED),
    _gpu("H200", 67, 494.7, 989.4, 1978.9, 141, 4800, "NVLink 4", 450, "InfiniBand NDR 400 Gb/s", 50,
         flops=H200_SHEET, memory=H200_SHEET, intra=NVLINK4, inter=IB_NDR),
    _gpu("B200", 75, 1100, 2250, 4500, 180, 7700, "NVLink 5", 900, "InfiniBand NDR 400 Gb/s", 50,
         flops=B200_SHEET, memory=B200_SHEET, intra=NVLINK5, inter=IB_NDR),
    _gpu("L40S", 91.6, 183, 362, 733, 48, 864, "PCIe Gen4 x16", 32, "Ethernet 100 Gb/s", 12.5,
         flops=ADA_SHEET, memory=ADA_SHEET, intra="PCIe Gen4 x16: 64 GB/s both directions, 32 GB/s each way; "
         "no NVLink", inter=ETH_ASSUMED),
    _gpu("RTX-4090", 82.6, 82.6, 165.2, 330.3, 24, 1008, "PCIe Gen4 x16", 32, "Ethernet 100 Gb/s", 12.5,
         flops=ADA_SHEET, memory=ADA_SHEET, intra="PCIe Gen4 x16: 32 GB/s each way; no NVLink and no peer-to-"
         "peer on GeForce cards (traffic goes through host memory: an upper bound)", inter=ETH_ASSUMED),
    # torchtitan's published H100 figures came from a 96 GB HBM2e, 2.4 TB/s, 500 W SXM part whose peak, its authors
    # write, "is between SXM and NVL, and we don't know its exact value": the SXM's peaks here (an upper bound);
    # H100_96GB_500W_PEAK_FLOOR is the NVL's, the lower bound, for a prediction given as the interval
    _gpu("H100-96GB-500W", 67, 494.7, 989.4, 1978.9, 96, 2400, "NVLink 4", 450, "InfiniBand NDR 400 Gb/s", 50,
         flops=H100_SHEET + "; the SXM peaks taken as this part's, an upper bound: torchtitan's "
         "benchmarks/llama3_h100_202412_torchtitan.md says this lower-TDP part's peak lies between the SXM's and "
         "the NVL's",
         memory="torchtitan docs/performance.md: H100 with 96 GB HBM2e at 2.4 TB/s, 500 W TDP", intra=NVLINK4,
         inter=IB_NDR),
):
    register(_p)

H100_96GB_500W_PEAK_FLOOR = "H100-NVL"  # the part whose peaks bound the 500 W part's from below (see above)

# the names CUDA gives these parts (torch.cuda.get_device_name), first match wins; a name that matches none (an A100
# PCIe, an H200 NVL, a GH200, the 96 GB H100: other clocks, memory or links) has no datasheet part here, never a guess
DEVICE_NAMES = ((r"H100.*PCIe", "H100-PCIe"), (r"H100 NVL", "H100-NVL"), (r"H100 80GB HBM3|H100 SXM", "H100-SXM"),
                (r"(?<!G)H200(?!.*NVL)", "H200"), (r"A100-SXM4-80GB", "A100-80GB-SXM"), (r"A100-SXM4-40GB", "A100-40GB-SXM"),
                (r"B200", "B200"), (r"L40S", "L40S"), (r"RTX 4090", "RTX-4090"))


def datasheet_part(device_name: str) -> Part | None:
    """The parts table's part a CUDA device's name is (e.g. 'NVIDIA H100 80GB HBM3' -> H100-SXM), or None."""
    for pattern, name in DEVICE_NAMES:
        if re.search(pattern, device_name or ""):
            return PARTS[name]
    return None


ALIASES = {"A100": "A100-80GB-SXM", "A100-80GB": "A100-80GB-SXM", "A100-40GB": "A100-40GB-SXM",
           "H100": "H100-SXM", "H200-SXM": "H200", "4090": "RTX-4090", "CPU": "this-cpu"}


def part(name: str) -> Part:
    """The part named `name` (case and '_'/' ' against '-' ignored; a few aliases: 'H100' is the SXM), or a
    ConfigError listing the known ones."""
    if isinstance(name, Part):
        return name
    wanted = re.sub(r"[\s_]+", "-", str(name).strip()).upper()
    by_key = {k.upper(): k for k in PARTS}
    key = by_key.get(wanted) or by_key.get(ALIASES.get(wanted, "").upper())
    if key is None:
        if wanted in ("THIS-CPU", "CPU"):
            raise ConfigError("the part 'this-cpu' is measured, not looked up: run scalekit.calibrate() first "
                              "(or predict with gpus='this-cpu', which calibrates)")
        if wanted == "THIS-GPU":
            raise ConfigError("the part 'this-gpu' is measured, not looked up: run scalekit.calibrate(device='cuda') "
                              "on the GPU first")
        raise ConfigError(f"unknown part {name!r}: the parts table knows {', '.join(sorted(PARTS))} "
                          f"(aliases {', '.join(sorted(ALIASES))}); add your own with "
                          f"scalekit.predict.register(Part(...))")
    return PARTS[key]


@dataclass(frozen=True)
class Cluster:
    """`count` GPUs of one part, `per_node` to a node (the intra-node link inside, the inter-node link across)."""

    part: Part
    count: int
    per_node: int

    @property
    def nodes(self) -> int:
        return -(-self.count // self.per_node)

    def describe(self) -> str:
        return (f"{self.count}× {self.part.name} ({self.nodes} node{'s' if self.nodes > 1 else ''} of "
                f"{min(self.count, self.per_node)})")


MAX_GPUS = 2**20


def gpus(spec, per_node: int | None = None) -> Cluster:
    """'8xH100-SXM', '64 x H100', 'H200' (one), or a Part: the GPUs a prediction is for.  Nodes hold
    GPUS_PER_NODE (8) GPUs unless `per_node` says otherwise."""
    if isinstance(spec, Cluster):
        return spec if per_node is None else dataclasses.replace(spec, per_node=per_node)
    if isinstance(spec, Part):
        count, name = 1, spec
    else:
        m = re.fullmatch(r"\s*(?:(\d+)\s*[x×*]\s*)?(.+?)\s*", str(spec))
        if not m:
            raise ConfigError(f"gpus={spec!r}: write it as COUNTxPART, e.g. '8xH100-SXM'")
        count, name = int(m.group(1) or 1), m.group(2)
    if not 1 <= count <= MAX_GPUS:
        raise ConfigError(f"gpus={spec!r}: the count must be from 1 to {MAX_GPUS:,} (above the largest clusters "
                          f"built, about 100,000 GPUs)")
    chosen = part(name)
    node = per_node if per_node is not None else (count if chosen.name == "this-cpu" else GPUS_PER_NODE)
    if node < 1:
        raise ConfigError(f"per_node={per_node!r}: a node holds at least one GPU")
    unmeasured = ("intra", chosen.intra_bandwidth) if count > 1 else None
    unmeasured = ("inter", chosen.inter_bandwidth) if count > node else unmeasured
    if unmeasured and not unmeasured[1]:  # a calibrated part whose link nothing measured nor a datasheet gives
        raise ConfigError(f"gpus={spec!r}: {chosen.name} has no {unmeasured[0]}-node link figure "
                          f"({chosen.sources.get(unmeasured[0], 'none given')}): predict it on "
                          f"{'one GPU' if unmeasured[0] == 'intra' else 'one node'}, or give the part a link")
    return Cluster(chosen, count, node)
