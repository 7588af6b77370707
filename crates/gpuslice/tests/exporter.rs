//! `gpuslice exporter` on an 8-GPU fake host, scraped by a real Prometheus
//! (Debian's `prometheus`), with a live slice ledger and a fake kubelet
//! PodResources server; `promtool check metrics` on its output; 100
//! concurrent scrapes.

use fakegpu::FakeHost;
use gpuslice_ledger::{DeviceSpec, Ledger};
use gpuslice_metrics::bench::scrape;
use gpuslice_metrics::pods::v1;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::GPUSLICE;
use gpuslice_testkit::process::Kill;
use gpuslice_testkit::{needs_program, precondition};
const GIB: u64 = 1 << 30;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn fake_kubelet(sock: &Path, gpu3: String, gpu5: String) {
    struct K(String, String);
    #[tonic::async_trait]
    impl v1::pod_resources_lister_server::PodResourcesLister for K {
        async fn list(
            &self,
            _: tonic::Request<v1::ListPodResourcesRequest>,
        ) -> Result<tonic::Response<v1::ListPodResourcesResponse>, tonic::Status> {
            let pod = |ns: &str, name: &str, id: String| v1::PodResources {
                name: name.into(),
                namespace: ns.into(),
                containers: vec![v1::ContainerResources {
                    name: "main".into(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec![id],
                    }],
                }],
            };
            Ok(tonic::Response::new(v1::ListPodResourcesResponse {
                pod_resources: vec![
                    pod("ns1", "pod-a", format!("{}::2", self.0)),
                    pod("ns2", "pod-b", self.1.clone()),
                ],
            }))
        }
    }
    let sock = sock.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&sock).unwrap();
            tx.send(()).unwrap();
            tonic::transport::Server::builder()
                .add_service(
                    v1::pod_resources_lister_server::PodResourcesListerServer::new(K(gpu3, gpu5)),
                )
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .unwrap();
        });
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // HTTP/1.0: no chunked bodies to undo.
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.lines().next()?;
    status.contains(" 200 ").then(|| body.to_string())
}

fn urlencode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus's instant query answer: (labels, value) per series.
fn query(prom: SocketAddr, q: &str) -> Vec<(Value, f64)> {
    let Some(body) = http_get(prom, &format!("/api/v1/query?query={}", urlencode(q))) else {
        return Vec::new();
    };
    let Some(start) = body.find('{') else {
        return Vec::new();
    };
    let end = body.rfind('}').unwrap_or(body.len() - 1);
    let Ok(v) = serde_json::from_str::<Value>(&body[start..=end]) else {
        return Vec::new();
    };
    v["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            let val = r["value"][1]
                .as_str()
                .unwrap_or("NaN")
                .parse()
                .unwrap_or(f64::NAN);
            (r["metric"].clone(), val)
        })
        .collect()
}

/// Polls `q` until it returns exactly `want` (one series) or times out.
fn expect_value(prom: SocketAddr, q: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last = Vec::new();
    while Instant::now() < deadline {
        last = query(prom, q);
        if last.len() == 1 && (last[0].1 - want).abs() <= want.abs() * 1e-9 {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("Prometheus: {q} gave {last:?}, want one series = {want}");
}

#[test]
fn prometheus_scrapes_gpus_slices_and_pods() {
    let _beside = common::beside_others();
    let host = FakeHost::builder().gpus(8).build().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let uuid = |i: usize| host.gpus()[i].uuid.clone();

    // A live slice: 20 GiB cap on GPU 1, unlimited on GPU 2; this process
    // holds 1 GiB on GPU 1.
    let ledgers = tmp.path().join("ledgers");
    std::fs::create_dir(&ledgers).unwrap();
    let ledger = Ledger::create(
        &ledgers.join("exp-test.ledger"),
        "exp-test",
        &[
            DeviceSpec {
                uuid: uuid(1),
                cap: 20 * GIB,
            },
            DeviceSpec {
                uuid: uuid(2),
                cap: gpuslice_ledger::UNLIMITED,
            },
        ],
    )
    .unwrap();
    let slot = ledger.attach().unwrap();
    ledger.reserve(slot, 0, GIB).unwrap();

    let sock = tmp.path().join("kubelet.sock");
    fake_kubelet(&sock, uuid(3), uuid(5));
    // A DRA claim prepared here: 20 GiB and 30 % of GPU 0.
    let dra = tmp.path().join("dra");
    common::write_dra_checkpoint(&dra);

    let port = free_port();
    let exporter_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let _exporter = Kill(
        host.command(GPUSLICE)
            .args(["--host-root"])
            .arg(host.root())
            .args([
                "exporter",
                "--listen",
                &exporter_addr.to_string(),
                "--interval",
                "200ms",
            ])
            .arg("--ledger-dir")
            .arg(&ledgers)
            .arg("--pod-resources-socket")
            .arg(&sock)
            .arg("--dra-state-dir")
            .arg(&dra)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(exporter_addr, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "exporter did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }

    // XID 79 on GPU 2, once the exporter's event set is registered (the
    // fake NVML delivers only what is injected after that).
    let metrics_with = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = http_get(exporter_addr, "/metrics").unwrap_or_default();
            if text.contains(want) {
                return text;
            }
            assert!(Instant::now() < deadline, "no {want:?} in:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    metrics_with("\ngpuslice_exporter_xid_events_up 1.0\n");
    host.inject_xid(2, 79).unwrap();
    metrics_with("xid=\"79\"");
    // The claim's namespace and name label its slice; its grant is the
    // slice's cap and share.
    let text = metrics_with(
        r#"gpuslice_dra_claim_info{slice="uid-1-0",claim_namespace="team-a",claim_name="train",claim_uid="uid-1",device="gpu-0-shared",gpu="0"} 1"#,
    );
    let l = format!("{{slice=\"uid-1-0\",gpu=\"0\",uuid=\"{}\"}}", uuid(0));
    assert!(
        text.contains(&format!("gpuslice_slice_memory_cap_bytes{l} 21474836480")),
        "{text}"
    );
    assert!(
        text.contains(&format!("gpuslice_slice_compute_share_ratio{l} 0.3")),
        "{text}"
    );

    // The classic text format passes promtool's checks.
    let text = http_get(exporter_addr, "/metrics").unwrap();
    assert!(text.contains("gpuslice_slice_memory_used_bytes{"), "{text}");
    let test = "prometheus_scrapes_gpus_slices_and_pods";
    if precondition(test, needs_program("promtool", "prometheus")) {
        let mut p = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // 100 concurrent scrapes, all answered.
    let handles: Vec<_> = (0..100)
        .map(|_| std::thread::spawn(move || scrape(exporter_addr, "/metrics")))
        .collect();
    let ok = handles
        .into_iter()
        .map(|h| h.join())
        .filter(
            |r| matches!(r, Ok(Ok((status, len, _))) if status.contains(" 200 ") && *len > 1000),
        )
        .count();
    assert_eq!(ok, 100, "concurrent scrapes answered");

    if !precondition(test, needs_program("prometheus", "prometheus")) {
        return;
    }
    let prom_port = free_port();
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: gpuslice\n    static_configs:\n      - targets: ['{exporter_addr}']\n"
        ),
    )
    .unwrap();
    let _prometheus = Kill(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    expect_value(prom, r#"up{job="gpuslice"}"#, 1.0);
    expect_value(prom, "count(gpuslice_gpu_memory_total_bytes)", 8.0);
    expect_value(prom, "count(gpuslice_gpu_info)", 8.0);
    // The labels of GPU `i`'s series.
    let gpu = |i: usize| {
        format!(
            r#"gpu="{i}",uuid="{}",pci_bus_id="{}",model="NVIDIA H200""#,
            uuid(i),
            host.gpus()[i].pci_bus_id
        )
    };
    let g3 = gpu(3);
    for (metric, want) in [
        ("gpuslice_gpu_temperature_celsius", 33.0),
        ("gpuslice_gpu_power_watts", 103.0),
        ("gpuslice_gpu_utilization_ratio", 0.3),
        ("gpuslice_gpu_sm_clock_hertz", 1.98e9),
        (
            "gpuslice_gpu_pcie_receive_bytes_per_second",
            8.0 * 1024.0 * 1000.0,
        ),
        ("gpuslice_gpu_ecc_corrected_errors_total", 3.0),
        (
            "gpuslice_gpu_memory_total_bytes",
            host.gpus()[3].memory_bytes as f64,
        ),
    ] {
        expect_value(prom, &format!("{metric}{{{g3}}}"), want);
    }
    expect_value(prom, r#"count(gpuslice_gpu_energy_joules_total > 0)"#, 8.0);
    expect_value(prom, "gpuslice_exporter_nvml_up", 1.0);
    expect_value(prom, "gpuslice_exporter_sample_age_seconds < bool 5", 1.0);

    // XID counters from NVML events: only GPU 2 has one.
    let g2 = gpu(2);
    expect_value(prom, "gpuslice_exporter_xid_events_up", 1.0);
    expect_value(
        prom,
        &format!(r#"gpuslice_gpu_xid_errors_total{{{g2},xid="79"}}"#),
        1.0,
    );
    expect_value(prom, &format!("gpuslice_gpu_last_xid{{{g2}}}"), 79.0);
    expect_value(prom, "count(gpuslice_gpu_xid_errors_total)", 1.0);
    expect_value(prom, "count(gpuslice_gpu_last_xid)", 1.0);

    // Slice metrics from the live ledger.
    let s1 = format!(r#"slice="exp-test",gpu="1",uuid="{}""#, uuid(1));
    let cap = format!("gpuslice_slice_memory_cap_bytes{{{s1}}}");
    let used = format!("gpuslice_slice_memory_used_bytes{{{s1}}}");
    for (query, want) in [
        (cap.as_str(), (20 * GIB) as f64),
        (&used, GIB as f64),
        (
            r#"count(gpuslice_slice_memory_cap_bytes{slice="exp-test"})"#,
            1.0,
        ),
        (
            r#"gpuslice_slice_memory_used_bytes{slice="exp-test",gpu="2"}"#,
            0.0,
        ),
        (r#"gpuslice_slice_processes{slice="exp-test"}"#, 1.0),
    ] {
        expect_value(prom, query, want);
    }
    // Use changes are seen on the next samples.
    ledger.reserve(slot, 0, GIB).unwrap();
    expect_value(prom, &used, (2 * GIB) as f64);

    // Pod labels from the PodResources server, replica ids mapped back.
    expect_value(prom, "gpuslice_exporter_pod_resources_up", 1.0);
    expect_value(
        prom,
        &format!(
            r#"gpuslice_gpu_pod_info{{namespace="ns1",pod="pod-a",container="main",device_id="{}::2",{g3}}}"#,
            uuid(3)
        ),
        1.0,
    );
    expect_value(
        prom,
        r#"gpuslice_gpu_pod_info{namespace="ns2",pod="pod-b",gpu="5"}"#,
        1.0,
    );
    ledger.detach(slot);
}
