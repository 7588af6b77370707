//! Health from XIDs injected into the fake NVML, and recovery (the fake
//! NVML is per process: the test holds `gpuslice_testkit::fakenvml::serve`
//! on its host throughout).

use fakegpu::FakeHost;
use gpuslice_core::HostRoot;
use gpuslice_k8s::plugin::config::Config;
use gpuslice_k8s::plugin::{spawn, Options};
use gpuslice_testkit::kubelet::{first_list, next_list, TestKubelet};
use std::time::Duration;

#[tokio::test]
async fn xids_mark_gpus_unhealthy_and_they_recover() {
    let host = FakeHost::builder().gpus(3).build().unwrap();
    let _nvml = gpuslice_testkit::fakenvml::serve(host.root());
    let t = tempfile::tempdir().unwrap();
    let mut cfg =
        Config::parse("health: {recoverAfterSeconds: 1}\nroles: [{gpus: [0, 1], role: whole}, {gpus: [2], role: shared, replicas: 2}]").unwrap();
    cfg.plugin_dir = t.path().join("plugins");
    cfg.ledger_dir = t.path().join("l");
    cfg.state_dir = t.path().join("s");
    let mut k = TestKubelet::start(&cfg.plugin_dir).await.unwrap();
    let mut o = Options::new(cfg, HostRoot::new(host.root()));
    o.nvml_lib = Some(host.nvml_lib());
    o.poll = Duration::from_millis(50);
    let p = spawn(o).unwrap();
    k.registrations_of(
        &["nvidia.com/gpu", "nvidia.com/gpu.shared"],
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    p.wait_for(Duration::from_secs(5), |s| s.health.watching == "events")
        .unwrap();
    let mut c = k.dial("gpuslice-gpu.sock").await.unwrap();
    let (first, mut stream) = first_list(&mut c).await.unwrap();
    assert!(first.iter().all(|d| d.health == "Healthy"));
    let mut cs = k.dial("gpuslice-gpu.shared.sock").await.unwrap();
    let (_, mut shared) = first_list(&mut cs).await.unwrap();

    // Application XIDs change nothing.
    for xid in [13, 31, 43, 45, 68, 109] {
        host.inject_xid(1, xid).unwrap();
    }
    assert!(
        next_list(&mut stream, Duration::from_millis(800))
            .await
            .is_err(),
        "no update for application XIDs"
    );
    p.wait_for(Duration::from_secs(3), |s| s.health.ignored_events == 6)
        .unwrap();

    // A real one on each role: GPU 1 (whole), then GPU 2 (shared): only
    // its devices turn unhealthy; the full list is re-sent.
    host.inject_xid(1, 79).unwrap();
    let l = next_list(&mut stream, Duration::from_secs(3))
        .await
        .unwrap();
    let health: Vec<_> = l.iter().map(|d| d.health.as_str()).collect();
    assert_eq!(health, vec!["Healthy", "Unhealthy"]);
    host.inject_xid(2, 79).unwrap();
    let l = next_list(&mut shared, Duration::from_secs(3))
        .await
        .unwrap();
    let bad: Vec<_> = l
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(
        bad,
        vec![
            format!("{}::0", host.gpus()[2].uuid),
            format!("{}::1", host.gpus()[2].uuid)
        ]
    );

    // Recovery after a quiet second of normal answers.
    let l = next_list(&mut stream, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(l.iter().all(|d| d.health == "Healthy"), "{l:?}");
    let l = next_list(&mut shared, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(l.iter().all(|d| d.health == "Healthy"), "{l:?}");
    let s = p.state.borrow().clone();
    assert_eq!(s.health.critical_events, 2);
    p.stop().unwrap();
}
