"""`moe-build fusion-report` end to end through the real console entry point."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_process import run_moe_build

MIXTRAL_FLAGS = ["--hidden", "4096", "--inter", "14336", "--experts", "8", "--top-k", "2", "--dtype", "bf16"]
# Below the intermediate size from which the FINALIZE tactic holds at every token count (2048).
NARROW_FLAGS = ["--hidden", "2048", "--inter", "1408", "--experts", "64", "--top-k", "2", "--dtype", "bf16"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_moe_build("fusion-report", *args, env=env, timeout=120)


def report(*args: str, env: dict | None = None) -> dict:
    r = run(*args, "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_json_schema_and_hopper_plan():
    doc = report(*MIXTRAL_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--tokens", "4")
    assert doc["schema"] == "moe-build.fusion-report/10"
    assert doc["path"] == "plugin"
    stages = {s["stage"]: s for s in doc["stages"]}
    assert list(stages) == ["routing_prologue", "expand_rows", "gemm_kernel", "fc1_activation", "fc2_prequant",
                            "finalize", "routing", "fc1_input_quant", "fc2_input_quant", "fp8_accumulation", "w1_order", "weight_layout",
                            "gemm1_tactic", "gemm2_tactic", "expand_rows_tactic", "fc1_input_quant_tactic",
                            "fc1_activation_tactic", "fc2_input_quant_tactic", "token_digits", "dispatch", "ep_format",
                            "nccl_exchange"]
    for s in doc["stages"]:
        assert set(s) >= {"stage", "choice", "fallback", "gates", "bands"}
        assert s["bands"][0][0] == 1 and s["bands"][-1][1] is None  # every token count from 1
        assert all(a[1] + 1 == b[0] for a, b in zip(s["bands"], s["bands"][1:]))  # no gap, no overlap
        for g in s["gates"]:
            assert set(g) >= {"name", "value", "condition", "held", "source"}
            assert ":" in g["source"] or g["source"].startswith("moe-build") or g["source"].startswith("docs/")
    assert stages["finalize"]["choice"] == "fused"
    assert stages["finalize"]["bands"] == [[1, None, "fused"]]  # intermediate_size >= 2048
    narrow = {s["stage"]: s for s in report(*NARROW_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--tokens", "1024")
              ["stages"]}
    assert narrow["finalize"]["choice"] == "fused"
    # 64 experts, top-2, intermediate 1408: fused up to 32 rows (16 tokens), separate on the decode kernel's
    # sizes, fused from 5 rows per expert (129 tokens)
    assert narrow["finalize"]["bands"] == [[1, 16, "fused"], [17, 128, "separate"], [129, None, "fused"]]
    # The seed's SM80 fused gated kernel is refused on TMA WS; moe-build's own gated epilogue takes its place.
    fc1 = stages["fc1_activation"]
    assert fc1["choice"] == "gated_epilogue" and fc1["fallback"] == "separate"
    held = {g["name"]: g["held"] for g in fc1["gates"]}
    assert held["fc1_not_tma_ws"] is False and held["gated_epilogue_tma_ws"] is True
    assert {g["source"] for g in fc1["gates"] if g["name"].startswith("gated_epilogue")} == {"moe-build"}
    assert stages["routing_prologue"]["bands"] == [[1, 256, "fused"], [257, None, "three_step"]]


@pytest.mark.parametrize("quant", ["fp8", "fp8_block"])
def test_fp8_layers_fuse_the_finalize_with_its_gates_shown(quant: str):
    """The FP8 GEMM2 has a FINALIZE tactic (mb_grouped_gemm_fp8_finalize): the report shows the decision with
    the gate that admits it, fused at every count (rules.FINALIZE_ALWAYS_FUSED_QUANTS, where a 16-bit layer's has
    a separate band), and forcing separate still plans."""
    doc = report(*NARROW_FLAGS, "--quant", quant, "--sm", "90", "--flavour", "tensorrt", "--tokens", "1024")
    fin = next(s for s in doc["stages"] if s["stage"] == "finalize")
    assert fin["choice"] == "fused"
    assert fin["bands"] == [[1, None, "fused"]]
    tactic = next(g for g in fin["gates"] if g["name"] == "finalize_tactic")
    assert tactic["held"] is True and tactic["value"] == f"bf16/{quant}"
    forced = report(*NARROW_FLAGS, "--quant", quant, "--sm", "90", "--flavour", "tensorrt", "--tokens", "1024",
                    "--force", "finalize=separate")
    assert next(s for s in forced["stages"] if s["stage"] == "finalize")["choice"] == "separate"
    # the weight-only GEMM2's FINALIZE tactics are its decode kernel's and its mixed-input kernel's: the rows gate says
    # where (the decode band's small calls, and past int8's decode band, 5 rows per expert, GEMM2's mixed-input tiles to
    # 48 rows)
    for tokens, choice in ((100, "separate"), (1024, "fused"), (2048, "separate")):
        weight_only = report(*NARROW_FLAGS, "--quant", "w8a16", "--sm", "90", "--flavour", "tensorrt", "--tokens",
                             str(tokens))
        fin = next(s for s in weight_only["stages"] if s["stage"] == "finalize")
        assert fin["choice"] == choice
        assert fin["bands"] == [[1, 16, "fused"], [17, 160, "separate"], [161, 1536, "fused"], [1537, None, "separate"]]
        assert next(g for g in fin["gates"] if g["name"] == "finalize_tactic")["held"] is True
        rows = next(g for g in fin["gates"] if g["name"] == "finalize_tactic_rows")
        assert rows["held"] is (choice == "fused") and "(the decode kernel)" in rows["condition"]
        assert ("gemm2=decode:" if tokens == 100 else "gemm2=wgmma:woq128x") in rows["value"]


def test_environment_gate_disables_finalize_fusion():
    for var in ("MOE_BUILD_DISABLE_FINALIZE_FUSION", "TRTLLM_MOE_DISABLE_FINALIZE_FUSION"):
        doc = report(*MIXTRAL_FLAGS, "--sm", "90", "--flavour", "tensorrt", env={var: "1"})
        fin = next(s for s in doc["stages"] if s["stage"] == "finalize")
        assert fin["choice"] == "separate"
        assert any(g["name"] == "finalize_env" and not g["held"] for g in fin["gates"])


def test_a_plugin_plan_past_sm_9x_says_moe_build_has_no_kernels_for_it():
    """On SM 100 / 120 the plugin path's stages are TensorRT-LLM's matrix, which moe-build's kernels cannot run:
    the report says so (from the plan's path gate) instead of showing them as what a build gives."""
    for sm, held in (("80", True), ("90", True), ("100", False), ("120", False)):
        doc = report(*MIXTRAL_FLAGS, "--sm", sm, "--flavour", "tensorrt")
        gate = {g["name"]: g for g in doc["path_gates"]}["plugin_kernels_sm"]
        assert (doc["path"], gate["held"], gate["value"]) == ("plugin", held, int(sm))
        assert ("moe-build has no kernels for" in doc["path_reason"]) is not held
    r = run(*MIXTRAL_FLAGS, "--sm", "100", "--flavour", "tensorrt", "--markdown")
    assert r.returncode == 0, r.stderr
    assert ("moe-build has no kernels for sm100 yet, plugin_kernels_sm fails: the stages show TensorRT-LLM's matrix "
            "and `build` refuses this plan") in r.stdout


def test_rtx_flavour_takes_ootb_and_says_why():
    doc = report(*MIXTRAL_FLAGS, "--sm", "89", "--flavour", "tensorrt-rtx")
    assert doc["path"] == "ootb"
    assert "flavour_plugin_layers" in doc["path_reason"]
    assert [s["stage"] for s in doc["stages"]] == ["expert_compute", "dispatch"]


def test_moe_plugin_disable_takes_ootb():
    doc = report(*MIXTRAL_FLAGS, "--sm", "89", "--flavour", "tensorrt", "--moe-plugin", "disable")
    assert doc["path"] == "ootb" and "moe_plugin" in doc["path_reason"]


@pytest.mark.parametrize("args,field", [
    (["--quant", "int3"], "quant"),
    (["--activation", "swish"], "activation"),
    (["--dtype", "fp64"], "dtype"),
    (["--top-k", "9"], "top_k"),
    (["--hidden", "-5"], "hidden_size"),
    (["--quant", "fp8", "--sm", "80"], "sm"),
    (["--sm", "75"], "sm"),
    (["--flavour", "onnx"], "flavour"),
    (["--moe-plugin", "maybe"], "moe_plugin"),
    (["--moe-plugin", "disable", "--quant", "w8a16", "--sm", "89"], "quant"),
    (["--moe-plugin", "disable", "--sm", "100"], "sm"),
])
def test_bad_input_is_one_line_exit_2(args, field):
    options = dict(zip(MIXTRAL_FLAGS[::2], MIXTRAL_FLAGS[1::2]))
    options["--flavour"] = "tensorrt"
    options.update(zip(args[::2], args[1::2]))
    r = run(*[x for kv in options.items() for x in kv])
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moe-build: error: ") and field in lines[0], r.stderr
    assert r.stdout == ""


def test_unsupported_combination_names_the_rule():
    r = run(*MIXTRAL_FLAGS, "--quant", "nvfp4", "--sm", "90", "--flavour", "tensorrt")
    assert r.returncode == 2 and "plugin_fp4_sm" in r.stderr and "mixtureOfExpertsPlugin.cpp:262" in r.stderr


def test_explain_lists_every_gate_with_sources():
    r = run(*MIXTRAL_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--explain", "finalize")
    assert r.returncode == 0, r.stderr
    for name in ("finalize_tma_ws", "finalize_sm90_not_wfp4a16", "finalize_topk_deterministic", "finalize_env",
                 "finalize_no_lora", "finalize_tactic"):
        assert name in r.stdout
    assert "mixtureOfExpertsPlugin.cpp:338" in r.stdout
    bad = run(*MIXTRAL_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--explain", "nonsense")
    assert bad.returncode == 2 and "routing_prologue" in bad.stderr


def test_markdown_and_table():
    md = run(*MIXTRAL_FLAGS, "--sm", "80", "--flavour", "tensorrt", "--markdown")
    assert md.returncode == 0 and "| fc1_activation | fused_gated |" in md.stdout
    table = run(*MIXTRAL_FLAGS, "--sm", "80", "--flavour", "tensorrt")
    assert table.returncode == 0 and "fused_gated" in table.stdout and "path: plugin" in table.stdout


def test_failed_gates_of_other_choices_are_marked():
    """On sm90 the gated epilogue is chosen with all of its gates held; the SM80 kernel's gate that
    failed is shown as another choice's, while a stage left at its fallback shows its own."""
    md = run(*NARROW_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--tokens", "64", "--markdown")
    assert md.returncode == 0, md.stderr
    rows = {line.split("|")[1].strip(): line for line in md.stdout.splitlines() if line.startswith("| ")}
    assert "| gated_epilogue | separate |" in rows["fc1_activation"]
    assert "other choices: fc1_non_gated=swiglu, fc1_not_tma_ws=tma_warp_specialized" in rows["fc1_activation"]
    assert "| separate | separate |" in rows["finalize"] and "other choices" not in rows["finalize"]
    assert "finalize_tactic_rows=" in rows["finalize"]
    forced = run(*NARROW_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--tokens", "64", "--markdown",
                 "--force", "finalize=fused")
    assert forced.returncode == 0, forced.stderr
    row = next(line for line in forced.stdout.splitlines() if line.startswith("| finalize |"))
    assert "| fused | separate |" in row and "finalize_tactic_rows=" in row and "other choices" not in row


def test_table_puts_each_failed_gate_on_its_own_line():
    """In the table two gates never share a line of the gates column, however wide the console."""
    import io

    from rich.console import Console

    from moe_build.planner import make_plan
    from moe_build.planner.report import render_table
    from moe_build.spec.presets import get_preset
    from moe_build.target import Flavour, Target
    out = io.StringIO()
    render_table(make_plan(get_preset("mixtral-8x7b"), Target(sm=90, flavour=Flavour.TENSORRT)),
                 Console(file=out, width=250))
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("│ FC1 activation"))
    cells = [line.split("│")[5].strip() for line in lines[start:start + 3]]
    assert cells == ["other choices:", "fc1_non_gated=swiglu", "fc1_not_tma_ws=tma_warp_specialized"], cells


def test_sweep_covers_the_matrix():
    undtyped = [f for f in MIXTRAL_FLAGS if f not in ("--dtype", "bf16")]
    r = run(*undtyped, "--flavour", "tensorrt", "--sweep", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cells = doc["cells"]
    assert len(cells) == 8 * 3 * 8
    by = {(c["sm"], c["dtype"], c["quant"]): c for c in cells}
    assert by[(80, "bf16", "fp8")]["refused_by"] == "plugin_fp8_sm"
    assert by[(90, "bf16", "nvfp4")]["refused_by"] == "plugin_fp4_sm"
    assert by[(100, "bf16", "nvfp4")]["path"] == "plugin"
    assert by[(90, "bf16", "none")]["choices"]["finalize"] == "fused"
    assert by[(89, "fp16", "none")]["choices"]["fc1_activation"] == "fused_gated"
    text = run(*MIXTRAL_FLAGS, "--flavour", "tensorrt", "--sweep")
    assert text.returncode == 0 and "sm120 bf16" in text.stdout


def test_sweep_keeps_to_the_sm_dtype_and_quant_given():
    """--sm, --dtype and --quant restrict the sweep to what they name (it never ignores them)."""
    doc = report(*MIXTRAL_FLAGS, "--flavour", "tensorrt", "--sweep", "--sm", "90", "--quant", "fp8")
    assert [(c["sm"], c["dtype"], c["quant"]) for c in doc["cells"]] == [(90, "bf16", "fp8")]


def test_a_named_gpu_part_sets_the_target_the_tactics_read():
    """--gpu plans for that part's SM, multiprocessors, L2 and memory rate, where --sm alone takes the SM's default
    part: an H200's block-128 layer at 32 tokens leaves the decode kernel that an H100's keeps
    (tactics.fp8.fp8_block_wide_band, an H200's 4.8 TB/s against an H100 SXM's 3.35)."""
    layer = ["--preset", "qwen3-30b-a3b", "--quant", "fp8_block", "--flavour", "tensorrt", "--tokens", "32"]
    h200, h100 = report(*layer, "--gpu", "h200"), report(*layer, "--sm", "90")
    assert {k: h200["target"][k] for k in ("sm", "sm_count", "l2_bytes", "memory_bytes_per_s", "sm_source")} == {
        "sm": 90, "sm_count": 132, "l2_bytes": 50 << 20, "memory_bytes_per_s": 4_800 * 10**9, "sm_source": "gpu h200"}
    assert (h100["target"]["memory_bytes_per_s"], h100["target"]["sm_source"]) == (3_352 * 10**9, "flag")
    tactic = {name: {s["stage"]: s["choice"] for s in doc["stages"]}["gemm1_tactic"].split(":")[0]
              for name, doc in (("h200", h200), ("h100", h100))}
    assert tactic == {"h200": "wgmma", "h100": "decode"}
    assert report(*layer, "--gpu", "h100-pcie", "--sm", "90")["target"]["sm_count"] == 114  # an --sm that agrees
    table = run(*layer, "--gpu", "h200")
    assert table.returncode == 0 and "qwen3-30b-a3b on h200, sm90" in table.stdout
    sweep = report(*layer[:4], "--flavour", "tensorrt", "--gpu", "l40s", "--sweep")
    assert {c["sm"] for c in sweep["cells"]} == {89}  # the part's SM only


@pytest.mark.parametrize("options", [("--json", "--markdown"), ("--explain", "finalize", "--json"),
                                     ("--sweep", "--markdown"), ("--sweep", "--explain", "path")])
def test_conflicting_output_options_are_refused(options):
    r = run(*options)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "cannot be combined" in r.stderr


def test_force_from_cli():
    doc = report(*MIXTRAL_FLAGS, "--sm", "90", "--flavour", "tensorrt", "--force", "gemm_kernel=ampere")
    stages = {s["stage"]: s for s in doc["stages"]}
    assert stages["gemm_kernel"]["forced"] and stages["fc1_activation"]["choice"] == "fused_gated"


def test_default_layer_is_the_tiny_preset(tmp_path: Path):
    doc = report("--sm", "89", "--flavour", "tensorrt")
    assert doc["spec"]["hidden_size"] == 64 and doc["spec"]["name"] == "tiny"


def _checkpoint(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_checkpoint_config_drives_the_report(tmp_path: Path):
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128,
           "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu", "torch_dtype": "bfloat16",
           "num_hidden_layers": 2, "intermediate_size": 6144, "decoder_sparse_step": 1, "mlp_only_layers": []}
    doc = report(str(_checkpoint(tmp_path, cfg)), "--sm", "90", "--flavour", "tensorrt", "--tokens", "300")
    assert doc["spec"]["num_experts"] == 128 and doc["spec"]["top_k"] == 8 and doc["spec"]["dtype"] == "bf16"
    stages = {s["stage"]: s["choice"] for s in doc["stages"]}
    assert stages["routing_prologue"] == "three_step"  # 300 tokens > 256
    # flags override the checkpoint
    doc = report(str(tmp_path / "ckpt"), "--sm", "90", "--flavour", "tensorrt", "--dtype", "fp16")
    assert doc["spec"]["dtype"] == "fp16"


def test_not_an_moe_checkpoint_exits_2(tmp_path: Path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 2}
    r = run(str(_checkpoint(tmp_path, cfg)), "--flavour", "tensorrt", "--sm", "90")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("moe-build: error: ")
