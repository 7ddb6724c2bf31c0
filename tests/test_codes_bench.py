"""The codec benchmark runs end to end and writes its report atomically."""

from __future__ import annotations

import json
import os

from psframework.bench import codec


def test_quick_codec_benchmark_writes_markdown_and_json(tmp_path, capsys):
    out = tmp_path / "bench"
    status = codec.main(["--out", str(out), "--quick", "--pairs", "5,3", "--mib", "0.05", "--repeats", "2",
                         "--limit", "10", "--threads", "2"])
    assert status == 0
    assert sorted(os.listdir(out)) == ["codec.json", "codec.md"]  # no temporary files left behind
    report = json.loads((out / "codec.json").read_text())
    assert report["command"].startswith("psf bench codec --out ")
    assert {"cpu", "cores", "numpy", "torch", "date", "blas"} <= set(report["machine"])
    assert report["machine"]["decode_threads"] == report["machine"]["blas_threads"] == 2
    assert report["command"].endswith("--threads 2")
    cells = {(r["code"], r["L"]): r for r in report["accuracy"]}
    assert len(cells) == 4 * len(codec.SYMBOLS)
    assert cells[("SAZD", 8)]["exhaustive"] and cells[("SAZD", 8)]["arrival_sets"] == 10
    assert cells[("SAZD", 8)]["worst_rel_error"] < 1e-5
    assert cells[("Poly integers", 8)]["worst_rel_error"] > cells[("SAZD", 8)]["worst_rel_error"]
    (row,) = report["speed"]
    assert (row["n"], row["k"]) == (5, 3)
    cases = row["sazd_decode"]
    assert set(cases) == {"all systematic", "1 systematic dropped", "first 2 systematic dropped",
                          "worst of 2 systematic dropped"}
    for case in cases.values():
        assert case["decode_s"] > 0 and case["numpy_sum_s"] > 0 and case["decode_min_s"] <= case["decode_s"]
        assert case["ratio_to_numpy_sum"] == case["decode_s"] / case["numpy_sum_s"]
    assert row["decode_stripes"] == 1  # 0.05 MiB: far too small to split
    threads = report["threads"]
    assert [t["block_set_MiB"] for t in threads] == [row["block_set_MiB"] * s for s in codec.THREAD_TABLE_SCALES]
    for t in threads:
        assert t["packets"] == [2, 3, 4] and t["stripes"] == 1
        assert t["speedup"] == t["one_thread_s"] / t["threads_s"] and min(t["one_thread_s"], t["threads_s"]) > 0
    markdown = (out / "codec.md").read_text()
    for heading in ("## Machine", "## Accuracy", "## Speed", "## Decode threads", "## Acceptance", report["command"],
                    "up to 2 decode threads", "Poly decodes with 2 BLAS threads"):
        assert heading in markdown
    assert "| (5,3) | 8 | 10 |" in markdown
    assert "wrote" in capsys.readouterr().out


def test_bad_options_exit_with_status_2(tmp_path, capsys):
    assert codec.main(["--out", str(tmp_path), "--pairs", "3,5"]) == 2
    assert "--pairs: '3,5' needs 1 <= k <= n" in capsys.readouterr().out
    assert codec.main(["--out", str(tmp_path), "--repeats", "0"]) == 2
    assert codec.main(["--out", str(tmp_path), "--threads", "0"]) == 2
    assert "--threads must be an integer >= 1, got 0" in capsys.readouterr().out
    assert not os.listdir(tmp_path)
