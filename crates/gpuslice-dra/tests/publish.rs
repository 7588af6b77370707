//! ResourceSlice publication against the FakeApiServer test double, from
//! the fake GPU host's inventory: what is published (devices, attributes,
//! capacities, request policies), the pool's generation, and the writes
//! under races (resourceVersion conflicts) and behind-the-back changes.

use crate::common::{
    device_names, fake_api, follow_for_an_hour, published_names, published_slice, NODE,
};
use fakegpu::FakeHost;
use gpuslice_core::Inventory;
use gpuslice_dra::apiserver::{KubeApi, SliceApi, SliceWriteError};
use gpuslice_dra::claim::DeviceKind;
use gpuslice_dra::publish::{
    devices, pool_devices, publish, slice_name, slices, PublishError, Published, SharedPolicy,
    Sick, Unhealthy, UNHEALTHY_TAINT,
};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_testkit::fakeapi::FakeApiServer;
use gpuslice_testkit::{wait_until, FAST_PATH_LIMIT};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn host() -> &'static FakeHost {
    static HOST: OnceLock<FakeHost> = OnceLock::new();
    HOST.get_or_init(|| FakeHost::builder().gpus(4).mig(3, 2).build().unwrap())
}

fn inventory() -> Inventory {
    gpuslice_testkit::fakenvml::discover(host())
}

/// Publishes `devices` as [`NODE`]'s pool of this driver.
async fn publish_node(
    api: &KubeApi,
    devices: &[k8s_openapi::api::resource::v1::Device],
) -> Result<Published, PublishError> {
    publish(api, DRIVER_NAME, NODE, devices).await
}

fn device<'a>(slice: &'a Value, name: &str) -> &'a Value {
    slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

/// The slices are owned by the node's Node object (so they go with it),
/// an old slice without the owner is put right, and a node name the API
/// server does not know is an error, not a pool published for nothing.
#[tokio::test]
async fn slices_are_owned_by_their_node_and_a_wrong_node_name_is_refused() {
    let (fake, api) = fake_api().await;
    let d = devices(&inventory(), &SharedPolicy::default());
    // Published before the owner was known (an older plugin).
    publish_node(&api, &d).await.unwrap();
    assert!(published_slice(&fake)["metadata"]["ownerReferences"].is_null());

    let e = api.own_slices_by("no-such-node").await.unwrap_err();
    assert!(
        e.to_string().contains("\"no-such-node\" is not known"),
        "{e}"
    );
    assert!(e.to_string().contains("--node-name"), "{e}");

    let uid = fake.put_node(NODE);
    api.own_slices_by(NODE).await.unwrap();
    let p = publish_node(&api, &d).await.unwrap();
    assert!(p.changed, "the owner alone is a change to write");
    assert_eq!(
        published_slice(&fake)["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid, "controller": true}])
    );
    let p = publish_node(&api, &d).await.unwrap();
    assert!(!p.changed);
}

#[tokio::test]
async fn one_device_per_gpu_and_mig_devices_with_attributes_capacities_and_policies() {
    let (fake, api) = fake_api().await;
    let inv = inventory();
    let d = devices(&inv, &SharedPolicy::default());
    let p = publish_node(&api, &d).await.unwrap();
    assert_eq!((p.generation, p.changed), (1, true));

    let s = published_slice(&fake);
    assert_eq!(fake.slices().len(), 1);
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(s["kind"], "ResourceSlice");
    assert_eq!(s["spec"]["driver"], DRIVER_NAME);
    assert_eq!(s["spec"]["nodeName"], NODE);
    assert_eq!(
        s["spec"]["pool"],
        json!({"name": NODE, "generation": 1, "resourceSliceCount": 1})
    );
    let names = device_names(s["spec"]["devices"].as_array().unwrap());
    assert_eq!(
        names,
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3-mig-0", "gpu-3-mig-1"],
        "one device per GPU, whole or shared; a GPU in MIG mode is offered as its MIG devices only"
    );
    // Every name is one Prepare understands.
    for n in &names {
        assert!(DeviceKind::parse(n).is_some(), "{n}");
    }

    let g = &host().gpus()[1];
    let whole = device(&s, "gpu-1");
    let a = &whole["attributes"];
    assert_eq!(a["uuid"], json!({"string": g.uuid}));
    assert_eq!(a["type"], json!({"string": "gpu"}));
    assert_eq!(a["index"], json!({"int": 1}));
    assert_eq!(a["productName"], json!({"string": inv.gpus[1].model}));
    assert_eq!(a["pciBusID"], json!({"string": g.pci_bus_id}));
    // 580.159.04 is not semver (a leading zero); published comparable.
    assert_eq!(
        inv.driver_version.as_deref(),
        Some("580.159.04"),
        "the fake host's driver"
    );
    assert_eq!(a["driverVersion"], json!({"version": "580.159.4"}));
    // The fake host's GPUs are all NVLinked: one domain, the lowest bus id.
    let lowest = host().gpus().iter().map(|g| &g.pci_bus_id).min().unwrap();
    assert_eq!(a["nvlinkDomain"], json!({"string": lowest}));
    // Shared through consumable capacity, memory defaulting to all of it:
    // a request that names none is the whole GPU, so the scheduler never
    // puts a whole-GPU claim beside a share.
    let mem = g.memory_bytes.to_string();
    assert_eq!(whole["allowMultipleAllocations"], true);
    assert_eq!(
        whole["capacity"],
        json!({
            "memory": {
                "value": mem,
                "requestPolicy": {
                    "default": mem,
                    "validRange": {"min": "1048576", "max": mem, "step": "1048576"},
                },
            },
            "compute": {
                "value": "100",
                "requestPolicy": {
                    // Naming no compute is best-effort: the scheduler
                    // counts the least, and memory keeps whole GPUs apart.
                    "default": "1",
                    "validRange": {"min": "1", "max": "100", "step": "1"},
                },
            },
        })
    );

    let mig = device(&s, "gpu-3-mig-1");
    assert_eq!(mig["attributes"]["type"], json!({"string": "mig"}));
    assert_eq!(
        mig["attributes"]["parentUUID"],
        json!({"string": host().gpus()[3].uuid})
    );
    assert!(mig["attributes"]["uuid"]["string"]
        .as_str()
        .unwrap()
        .starts_with("MIG-"));
}

#[tokio::test]
async fn a_configured_memory_step_is_published_and_rounds_the_memory_down() {
    let (fake, api) = fake_api().await;
    let policy = SharedPolicy {
        memory_step: 256 << 20,
    };
    let mut inv = inventory();
    // Not a multiple of the step: what is offered is whole steps of it.
    inv.gpus[0].memory_bytes = Some((10 << 30) + (100 << 20));
    publish_node(&api, &devices(&inv, &policy)).await.unwrap();
    let s = published_slice(&fake);
    let c = &device(&s, "gpu-0")["capacity"];
    let usable = (10u64 << 30).to_string();
    assert_eq!(c["memory"]["value"], usable);
    assert_eq!(c["memory"]["requestPolicy"]["default"], usable);
    assert_eq!(
        c["memory"]["requestPolicy"]["validRange"],
        json!({"min": "268435456", "max": usable, "step": "268435456"})
    );
    assert_eq!(c["compute"]["requestPolicy"]["default"], "1");
    // Without its memory size (no NVML) a GPU is offered whole only.
    inv.gpus[1].memory_bytes = None;
    let d = devices(&inv, &policy);
    let g1 = d.iter().find(|d| d.name == "gpu-1").unwrap();
    assert!(g1.capacity.is_none() && g1.allow_multiple_allocations.is_none());
}

#[tokio::test]
async fn unchanged_writes_nothing_and_a_change_moves_the_generation() {
    let (fake, api) = fake_api().await;
    let mut inv = inventory();
    let d = devices(&inv, &SharedPolicy::default());
    publish_node(&api, &d).await.unwrap();
    let writes = fake.slice_writes();
    let again = publish_node(&api, &d).await.unwrap();
    assert_eq!((again.generation, again.changed), (1, false));
    assert_eq!(
        fake.slice_writes(),
        writes,
        "nothing changed, nothing written"
    );

    // A GPU disappears: the pool moves to generation 2 without it.
    inv.gpus.retain(|g| g.index != 2);
    let d = devices(&inv, &SharedPolicy::default());
    let p = publish_node(&api, &d).await.unwrap();
    assert_eq!((p.generation, p.changed), (2, true));
    let s = published_slice(&fake);
    assert_eq!(s["spec"]["pool"]["generation"], 2);
    assert_eq!(s["metadata"]["generation"], 2, "the server saw a new spec");
    let names = device_names(s["spec"]["devices"].as_array().unwrap());
    assert!(!names.iter().any(|n| n.starts_with("gpu-2")), "{names:?}");
}

#[tokio::test]
async fn a_racing_writer_is_never_overwritten_blindly() {
    let (fake, api) = fake_api().await;
    let mut inv = inventory();
    publish_node(&api, &devices(&inv, &SharedPolicy::default()))
        .await
        .unwrap();

    // The double itself: a stale or missing resourceVersion is a conflict,
    // a create of a taken name too.
    let mut stale: k8s_openapi::api::resource::v1::ResourceSlice =
        serde_json::from_value(published_slice(&fake)).unwrap();
    stale.metadata.resource_version = Some("1".into());
    fake.touch_slice(&slice_name(NODE, DRIVER_NAME, 0), |_| {});
    assert!(matches!(
        api.update_slice(&stale).await,
        Err(SliceWriteError::Conflict(..))
    ));
    stale.metadata.resource_version = None;
    assert!(matches!(
        api.update_slice(&stale).await,
        Err(SliceWriteError::Conflict(..))
    ));
    let fresh = slices(DRIVER_NAME, NODE, 1, &[]).remove(0);
    assert!(matches!(
        api.create_slice(&fresh).await,
        Err(SliceWriteError::Conflict(..))
    ));

    // Two races in a row: the publisher re-reads and wins on the third try.
    inv.gpus.retain(|g| g.index != 0);
    let d = devices(&inv, &SharedPolicy::default());
    fake.interfere_with_updates(2);
    let p = publish_node(&api, &d).await.unwrap();
    assert!(p.changed);
    let s = published_slice(&fake);
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        s["spec"]["devices"],
        "the publisher's devices, written after the races"
    );

    // Races without end: an error naming the conflict, not a blind write.
    inv.gpus.retain(|g| g.index != 1);
    fake.interfere_with_updates(100);
    let e = publish_node(&api, &devices(&inv, &SharedPolicy::default()))
        .await
        .unwrap_err();
    assert!(matches!(e, PublishError::Conflicts(_)), "{e}");
    assert!(
        e.to_string().contains("the object has been modified"),
        "{e}"
    );
}

#[tokio::test]
async fn slices_changed_behind_its_back_are_put_right() {
    let (fake, api) = fake_api().await;
    let d = devices(&inventory(), &SharedPolicy::default());
    publish_node(&api, &d).await.unwrap();
    let name = slice_name(NODE, DRIVER_NAME, 0);

    // Someone edits a device away: the next publication restores it, at a
    // higher generation.
    fake.touch_slice(&name, |s| {
        s["spec"]["devices"].as_array_mut().unwrap().remove(0);
    });
    let p = publish_node(&api, &d).await.unwrap();
    assert_eq!((p.generation, p.changed), (2, true));
    assert_eq!(
        published_slice(&fake)["spec"]["devices"],
        serde_json::to_value(&d).unwrap()
    );

    // Deleted: re-created. A stray slice of this node's pool: deleted.
    fake.remove_slice(&name);
    let mut stray = slices(DRIVER_NAME, NODE, 3, &d).remove(0);
    stray.metadata.name = Some(slice_name(NODE, DRIVER_NAME, 7));
    api.create_slice(&stray).await.unwrap();
    // Another node's slice is not ours to touch.
    let other = slices(DRIVER_NAME, "node-b", 1, &d).remove(0);
    api.create_slice(&other).await.unwrap();
    let p = publish_node(&api, &d).await.unwrap();
    assert_eq!(p.generation, 4, "above the stray's generation 3");
    let all = fake.slices();
    let ours: Vec<&String> = all
        .iter()
        .filter(|(_, s)| s["spec"]["nodeName"] == NODE)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(ours, [&name]);
    assert!(all.contains_key(&slice_name("node-b", DRIVER_NAME, 0)));
}

fn sick(gpu: u32, why: &str) -> std::collections::BTreeMap<u32, Sick> {
    let since = k8s_openapi::jiff::Timestamp::from_second(1_780_000_000).unwrap();
    std::collections::BTreeMap::from([(
        gpu,
        Sick {
            why: why.into(),
            since,
        },
    )])
}

#[tokio::test]
async fn an_unhealthy_gpu_is_tainted_and_republishing_it_writes_nothing() {
    let (fake, api) = fake_api().await;
    let inv = inventory();
    let policy = SharedPolicy::default();
    let healthy = devices(&inv, &policy);
    let bad = pool_devices(&inv, &policy, &sick(3, "XID 48"), None, Unhealthy::Taint);
    // Nothing leaves: the GPU's devices (its MIG devices, GPU 3 is in MIG
    // mode) are tainted, the others untouched.
    assert_eq!(bad.len(), healthy.len());
    for d in &bad {
        let t = d.taints.as_deref().unwrap_or_default();
        if DeviceKind::parse(&d.name).unwrap().gpu() == 3 {
            assert_eq!(t.len(), 1, "{}", d.name);
            assert_eq!(t[0].key, UNHEALTHY_TAINT);
            assert_eq!(t[0].value.as_deref(), Some("48"));
            assert_eq!(t[0].effect, "NoSchedule");
        } else {
            assert!(t.is_empty(), "{}", d.name);
        }
    }
    // Not an XID: a label value still.
    let odd = pool_devices(
        &inv,
        &policy,
        &sick(0, "XID (unknown)"),
        None,
        Unhealthy::Taint,
    );
    assert_eq!(
        odd[0].taints.as_ref().unwrap()[0].value.as_deref(),
        Some("unknown")
    );

    publish_node(&api, &healthy).await.unwrap();
    let p = publish_node(&api, &bad).await.unwrap();
    assert_eq!(
        (p.generation, p.changed, p.taints_dropped),
        (2, true, false)
    );
    // timeAdded survives the round trip: the same state is no change.
    let writes = fake.slice_writes();
    let p = publish_node(&api, &bad).await.unwrap();
    assert_eq!((p.generation, p.changed), (2, false));
    assert_eq!(fake.slice_writes(), writes);
    let s = published_slice(&fake);
    assert_eq!(
        device(&s, "gpu-3-mig-1")["taints"][0]["timeAdded"],
        "2026-05-28T20:26:40Z"
    );
    // Recovery: the taints go, a new generation.
    let p = publish_node(&api, &healthy).await.unwrap();
    assert_eq!((p.generation, p.changed), (3, true));
    assert!(device(&published_slice(&fake), "gpu-3-mig-1")["taints"].is_null());
}

#[tokio::test]
async fn tainted_pools_split_at_64_devices_per_slice() {
    let d: Vec<k8s_openapi::api::resource::v1::Device> = (0..100)
        .map(|i| k8s_openapi::api::resource::v1::Device {
            name: format!("gpu-{i}"),
            ..Default::default()
        })
        .collect();
    assert_eq!(slices(DRIVER_NAME, NODE, 1, &d).len(), 1);
    let mut t = d.clone();
    t[99].taints = Some(vec![Default::default()]);
    let s = slices(DRIVER_NAME, NODE, 1, &t);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].spec.devices.as_ref().unwrap().len(), 64);
}

/// The published device names once `ok` holds of them.
async fn wait_names(
    fake: &FakeApiServer,
    what: &str,
    ok: &dyn Fn(&[String]) -> bool,
) -> Vec<String> {
    wait_until(what, FAST_PATH_LIMIT, || ok(&published_names(fake))).await;
    published_names(fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_server_drops_taints_an_unhealthy_gpu_leaves_the_pool() {
    let fake = FakeApiServer::start().await;
    fake.drop_device_taints(true);
    let api = KubeApi::new(&fake.url, None).unwrap();
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(inventory());
    let (tx, rx) = tokio::sync::watch::channel(Default::default());
    let follower = follow_for_an_hour(api, SharedPolicy::default(), inv_rx, rx);
    let has_1 = |n: &[String]| n.iter().any(|x| x.starts_with("gpu-1"));
    wait_names(&fake, "first publication", &has_1).await;
    tx.send_modify(|s: &mut gpuslice_health::Snapshot| {
        s.unhealthy.insert(1, "XID 79".into());
    });
    // Tainted, the taints dropped, then left out: no untainted offer of a
    // broken GPU stays.
    let n = wait_names(&fake, "GPU 1 out", &|n| !has_1(n)).await;
    assert!(n.contains(&"gpu-2".to_string()), "{n:?}");
    tx.send_modify(|s| {
        s.unhealthy.clear();
    });
    wait_names(&fake, "GPU 1 back", &has_1).await;
    drop(tx);
    tokio::time::timeout(std::time::Duration::from_secs(5), follower)
        .await
        .unwrap()
        .unwrap();
}
