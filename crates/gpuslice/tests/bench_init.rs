//! `gpuslice bench init` end to end on the fake GPU host: the runs, the
//! table, the JSON and the SVG. The fake driver charges a simulated cost
//! per reachable GPU in cuInit, so these tests prove the wiring (every
//! method runs what it should and isolation reaches fewer GPUs), not
//! performance. Needs root for the isolated methods (see scripts/test.sh).

use fakegpu::{FakeHost, FakeHostBuilder};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
const METHODS: [&str; 5] = ["none", "env", "namespace", "cgroup", "full"];
/// Simulated cuInit cost per reachable GPU.
const INIT_MS_PER_GPU: u64 = 15;

fn fake_host() -> FakeHostBuilder {
    FakeHost::builder().gpus(8).init_ms_per_gpu(INIT_MS_PER_GPU)
}

fn bench(h: &FakeHost, args: &[&str]) -> Output {
    common::gpuslice_on(h)
        .args(["bench", "init"])
        .args(args)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("spawn gpuslice")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The one file in `dir` whose name starts with `prefix` and ends with `ext`.
fn only_file(dir: &Path, prefix: &str, ext: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with(prefix) && name.ends_with(ext)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{prefix}*{ext} in {}: {found:?}",
        dir.display()
    );
    found.into_iter().next().unwrap()
}

fn cell<'a>(doc: &'a Value, k: u64, method: &str) -> &'a Value {
    doc["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["k"] == k && c["method"] == method)
        .unwrap_or_else(|| panic!("no cell k={k} {method}"))
}

fn median(doc: &Value, k: u64, method: &str, metric: &str) -> f64 {
    cell(doc, k, method)["summary_ms"][metric]["median"]
        .as_f64()
        .unwrap_or_else(|| panic!("no {metric} median for k={k} {method}"))
}

/// Polylines drawn with the series' stroke (axes and whiskers are thinner).
fn series_lines(svg: &str) -> usize {
    svg.split("<polyline")
        .skip(1)
        .filter(|rest| {
            rest.split("/>")
                .next()
                .unwrap_or("")
                .contains("stroke-width=\"2\"")
        })
        .count()
}

/// The contents of the SVG's text elements.
fn svg_texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>'))
        .map(|(_, t)| t.split("</text>").next().unwrap_or("").trim())
        .collect()
}

#[test]
fn probe_pipeline_end_to_end_and_full_isolation_reaches_one_gpu() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let out_dir = tempfile::tempdir().unwrap();
    let out = bench(
        &h,
        &[
            "--counts",
            "1,8",
            "--runs",
            "3",
            "--out",
            out_dir.path().to_str().unwrap(),
        ],
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");

    // The table: every method at every k, all runs good.
    let stdout = String::from_utf8_lossy(&out.stdout);
    for k in ["1", "8"] {
        for m in METHODS {
            let row = stdout
                .lines()
                .find(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() > 3 && w[0] == k && w[1] == m
                })
                .unwrap_or_else(|| panic!("no row k={k} {m}: {all}"));
            assert!(row.contains("3/3"), "{row}\n{all}");
        }
    }
    assert!(
        stdout.contains("cuInit") && stdout.contains("spawn"),
        "{all}"
    );

    // The JSON: metadata, samples and summaries.
    let json_path = only_file(out_dir.path(), "bench-init-", ".json");
    let doc: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(doc["workload"], "probe");
    assert_eq!(doc["host"]["gpu_count"], 8);
    assert_eq!(doc["host"]["persistence_mode"], "on", "{}", doc["host"]);
    assert!(doc["host"]["driver_version"].is_string(), "{}", doc["host"]);
    assert!(doc["host"]["kernel"].is_string());
    assert!(doc["command"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--counts"));
    assert_eq!(doc["metrics"]["init_ms"]["measured_by"], "process");
    assert_eq!(doc["metrics"]["wall_ms"]["measured_by"], "bench");
    assert_eq!(doc["cells"].as_array().unwrap().len(), 10);
    for k in [1, 8] {
        for m in METHODS {
            let c = cell(&doc, k, m);
            assert_eq!(c["samples"].as_array().unwrap().len(), 3, "{c}");
            assert_eq!(c["ok"], 3, "{c}");
            assert_eq!(c["warmup_samples"].as_array().unwrap().len(), 1, "{c}");
            let argv = common::strings(&c["argv"]);
            if m == "none" {
                assert!(!argv.contains(&"run"), "{argv:?}");
            } else {
                let root = h.root().to_str().unwrap();
                assert!(
                    argv.windows(2).any(|w| w == ["--host-root", root]),
                    "{argv:?}"
                );
                assert!(argv.windows(2).any(|w| w == ["--isolation", m]), "{argv:?}");
            }
            let wall = median(&doc, k, m, "wall_ms");
            let total = median(&doc, k, m, "total_ms");
            assert!(wall >= total, "k={k} {m}: wall {wall} < in-process {total}");
        }
    }
    // none reaches all 8 GPUs, full only GPU 0: 7 × 15 ms less cuInit.
    let none = median(&doc, 1, "none", "init_ms");
    let full = median(&doc, 1, "full", "init_ms");
    assert!(none - full > 60.0, "none {none} ms, full {full} ms");
    let ratio = cell(&doc, 1, "full")["ratio_to_none"]["init_ms"]
        .as_f64()
        .unwrap();
    assert!((ratio - full / none).abs() < 1e-9);
    assert!(
        (cell(&doc, 1, "full")["ratio_to_k1"]["init_ms"]
            .as_f64()
            .unwrap()
            - 1.0)
            .abs()
            < 1e-9
    );
    // At k=8 full reaches all eight, like none.
    assert!(median(&doc, 8, "full", "init_ms") - full > 60.0);

    // The SVG: one line per method in each of its two panels.
    let svg_path = only_file(out_dir.path(), "bench-init-", ".svg");
    assert_eq!(json_path.with_extension("svg"), svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(series_lines(&svg), 2 * METHODS.len(), "{svg}");
    let texts = svg_texts(&svg);
    for m in METHODS {
        assert!(texts.contains(&m), "no legend for {m}: {texts:?}");
    }
}

/// A new directory holding a stand-in for python3 that prints what the
/// torch script would, and fails where no slice set CUDA_VISIBLE_DEVICES
/// (method none); and the stand-in's path.
fn fake_python() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("python3");
    std::fs::write(
        &path,
        r#"#!/bin/sh
if [ -z "$CUDA_VISIBLE_DEVICES" ]; then echo "boom: no slice" >&2; exit 3; fi
n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | wc -l)
echo "{\"import_ms\": 1.5, \"init_ms\": 2.5, \"tensor_ms\": 3.5, \"total_ms\": 7.5, \"count\": $n}"
"#,
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, path)
}

#[test]
fn torch_workload_and_failed_runs_are_recorded_not_dropped() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let (dir, python) = fake_python();
    let out_dir = dir.path().join("results");
    let out = bench(
        &h,
        &[
            "--workload",
            "torch",
            "--python",
            python.to_str().unwrap(),
            "--counts",
            "1,2",
            "--methods",
            "none,env,full",
            "--runs",
            "2",
            "--warmup",
            "0",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("failed runs:"), "{all}");
    assert!(stdout.contains("boom: no slice"), "{all}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("4 of 12 runs failed"),
        "{all}"
    );

    let doc: Value = serde_json::from_slice(
        &std::fs::read(only_file(&out_dir, "bench-init-torch-", ".json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc["workload"], "torch");
    for k in [1, 2] {
        let none = cell(&doc, k, "none");
        assert_eq!(
            (none["ok"].as_u64(), none["failed"].as_u64()),
            (Some(0), Some(2))
        );
        let s = &none["samples"][0];
        assert_eq!(s["ok"], false);
        assert_eq!(s["exit_code"], 3);
        assert!(s["stderr"].as_str().unwrap().contains("boom"), "{s}");
        assert!(none["summary_ms"].as_object().unwrap().is_empty(), "{none}");
        for m in ["env", "full"] {
            assert_eq!(cell(&doc, k, m)["ok"], 2, "{}", cell(&doc, k, m));
            assert_eq!(median(&doc, k, m, "init_ms"), 2.5);
            assert!(median(&doc, k, m, "ready_ms") > 0.0);
        }
    }
    let svg = std::fs::read_to_string(only_file(&out_dir, "bench-init-torch-", ".svg")).unwrap();
    // none has no point to draw; env and full have a line in each panel.
    assert!(series_lines(&svg) >= 4, "{svg}");
}

#[test]
fn json_flag_prints_the_document_and_all_failing_warmups_stop_early() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let (_dir, python) = fake_python();
    let py = python.to_str().unwrap();
    // `--workload torch` with the fake python, one GPU, one method.
    let torch = |flags: &[&str], method: &str, runs: &str| {
        let workload = ["--workload", "torch", "--python", py, "--counts", "1"];
        let method = ["--methods", method, "--runs", runs];
        bench(&h, &[flags, &workload, &method].concat())
    };
    let out = torch(&["--json"], "env", "1");
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(cell(&doc, 1, "env")["ok"], 1);

    let out = torch(&[], "none", "50");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("every warm-up run failed"), "{all}");
    assert!(all.contains("boom"), "{all}");
}

#[test]
fn bad_counts_fail_with_a_reason() {
    let (_beside, h) = common::host_beside_others(fake_host());
    let out = bench(&h, &["--counts", "9"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("between 1 and the host's 8 GPUs"),
        "{}",
        text(&out)
    );
}
