//! Health re-publication: an XID injected into the fake NVML takes the
//! GPU's devices out of the published pool; after recovery they return.
//! Its own test binary: the fake NVML follows `FAKEGPU_ROOT`, one host per
//! process.

use fakegpu::FakeHost;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_dra::apiserver::HttpApi;
use gpuslice_dra::publish::{follow, slice_name, SharedPolicy};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_k8s::plugin::config::Health;
use gpuslice_testkit::fakeapi::FakeApiServer;
use serde_json::Value;
use std::time::{Duration, Instant};

const NODE: &str = "node-a";

fn slice0(api: &FakeApiServer) -> Value {
    api.slices()
        .remove(&slice_name(NODE, DRIVER_NAME, 0))
        .expect("slice 0 published")
}

/// The device names published for `node` now.
fn published_names(api: &FakeApiServer) -> Vec<String> {
    api.slices()
        .get(&slice_name(NODE, DRIVER_NAME, 0))
        .and_then(|s| s["spec"]["devices"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

async fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_takes_the_gpu_out_of_the_pool_until_it_recovers() {
    let h = FakeHost::builder().gpus(3).build().unwrap();
    std::env::set_var("FAKEGPU_ROOT", h.root());
    let inv = discover(
        &HostRoot::new(h.root()),
        &DiscoverOptions {
            nvml_lib: Some(h.nvml_lib()),
            ..DiscoverOptions::default()
        },
    )
    .unwrap();
    let fake = FakeApiServer::start().await;
    let api = HttpApi::new(&fake.url, None).unwrap();
    let (tx, rx) = tokio::sync::watch::channel(Default::default());
    let health = Health {
        recover_after_seconds: 1,
        ..Health::default()
    };
    let watcher = gpuslice_k8s::plugin::health::start(&inv, &health, Some(h.nvml_lib()), tx);
    let mut watching = rx.clone();
    let policy = SharedPolicy::default();
    let follower = {
        let inv = inv.clone();
        tokio::spawn(async move {
            follow(
                &api,
                DRIVER_NAME,
                NODE,
                &inv,
                &policy,
                rx,
                Duration::from_secs(3600),
            )
            .await
        })
    };
    let all =
        |n: &[String]| n.iter().any(|x| x == "gpu-1") && n.iter().any(|x| x == "gpu-1-shared");
    wait_until("first publication", Duration::from_secs(10), || {
        all(&published_names(&fake))
    })
    .await;
    tokio::time::timeout(
        Duration::from_secs(10),
        watching.wait_for(|s| s.watching == "events"),
    )
    .await
    .expect("the XID watcher runs")
    .unwrap();

    // An application XID changes nothing; a critical one takes GPU 1 out.
    h.inject_xid(1, 13).unwrap();
    h.inject_xid(1, 79).unwrap();
    let took = wait_until("GPU 1 out after XID 79", Duration::from_secs(5), || {
        !published_names(&fake)
            .iter()
            .any(|n| n.starts_with("gpu-1"))
    })
    .await;
    eprintln!("re-published {took:?} after the XID");
    let names = published_names(&fake);
    assert!(names.contains(&"gpu-0".to_string()) && names.contains(&"gpu-2-shared".to_string()));
    let s = slice0(&fake);
    assert_eq!(s["spec"]["pool"]["generation"], 2);

    // Quiet for recoverAfterSeconds and answering: back, at generation 3.
    wait_until("GPU 1 back after recovery", Duration::from_secs(10), || {
        all(&published_names(&fake))
    })
    .await;
    assert_eq!(slice0(&fake)["spec"]["pool"]["generation"], 3);
    drop(watcher); // the sender goes: follow returns
    tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("follow ends with its health source")
        .unwrap();
}
