//! The DRA driver's self-test and benchmark (crate gpuslice-bench, the GPU
//! machine's check) on the fake host: `bench dra-selftest prepare`
//! publishes the GPUs to the API test double and prepares the two claims
//! (20Gi/30, 40Gi/60); `gpuslice run --cdi-device` runs each with exactly
//! its cap; `unprepare` (a restarted plugin) removes every spec and record;
//! `bench dra` reports its latencies. Needs root and the workspace built.

use crate::common;
use common::slice::{gpuslice, slice_host};
use gpuslice_testkit::shim_client;
use serde_json::Value;
use std::path::Path;

const GIB: u64 = 1 << 30;

#[test]
fn the_dra_selftest_prepares_claims_that_run_with_their_caps() {
    let (_beside, h, ledgers) = slice_host(2);
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let w = work.to_str().unwrap();
    // `bench dra-selftest STEP`'s JSON report.
    let selftest = |step: &str| {
        let args = ["--json", "bench", "dra-selftest", step, "--work", w];
        common::json_stdout(&gpuslice(&h, ledgers.path(), &args).output().unwrap())
    };
    let rep = selftest("prepare");
    assert_eq!(rep["pass"], true, "{rep:#}");
    assert_eq!(
        rep["published"]["shared_device"]["allowMultipleAllocations"], true,
        "{rep:#}"
    );
    let claims = rep["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 2, "{rep:#}");

    let c = shim_client();
    for (claim, cap) in claims.iter().zip([20, 40]) {
        let id = claim["cdi_device_ids"][0].as_str().unwrap();
        let cdi = work.join("cdi");
        let script = format!(
            "{}exec {} info",
            common::fake_driver_preamble(&h),
            c.display()
        );
        let out = gpuslice(
            &h,
            ledgers.path(),
            &[
                "run",
                "--cdi-spec-dir",
                cdi.to_str().unwrap(),
                "--cdi-device",
                id,
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .output()
        .unwrap();
        let v = common::json_stdout(&out);
        assert_eq!(v["total"], cap * GIB, "{id}: {v}");
    }

    let rep = selftest("unprepare");
    assert_eq!(rep["pass"], true, "{rep:#}");
    assert_eq!(rep["unprepared"].as_array().unwrap().len(), 2, "{rep:#}");
    let specs: Vec<_> = std::fs::read_dir(work.join("cdi"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json") || n.starts_with("gpuslice-limits-"))
        .collect();
    assert!(specs.is_empty(), "left behind: {specs:?}");
}

#[test]
fn bench_dra_reports_prepare_latencies_and_publication_after_xids() {
    let (_beside, h, ledgers) = slice_host(2);
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("dra.json");
    let out = gpuslice(
        &h,
        ledgers.path(),
        &[
            "bench",
            "dra",
            "--claims",
            "40",
            "--window",
            "5",
            "--health-rounds",
            "2",
            "--out",
            out_file.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let rep: Value = serde_json::from_slice(
        &std::fs::read(&out_file)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr))),
    )
    .unwrap();
    let prep = &rep["prepare"]["latency"];
    assert_eq!(prep["n"], 40, "{rep:#}");
    assert!(prep["p99_ms"].as_f64().unwrap() <= prep["max_ms"].as_f64().unwrap());
    // 40 claims over 2 GPUs with 5 kept per GPU: 30 unprepared.
    assert_eq!(rep["prepare"]["unprepare_latency"]["n"], 30, "{rep:#}");
    assert_eq!(rep["health"]["source"], "xid", "{rep:#}");
    assert_eq!(rep["health"]["to_taint"]["n"], 2, "{rep:#}");
    assert_eq!(rep["health"]["to_untaint"]["n"], 2, "{rep:#}");
    assert!(rep["host"]["gpu_count"] == 2, "{rep:#}");
    // The exit status is the verdict.
    assert_eq!(out.status.success(), rep["pass"] == true, "{rep:#}");
    assert!(!Path::new(&rep["host_root"].as_str().unwrap())
        .as_os_str()
        .is_empty());
}
