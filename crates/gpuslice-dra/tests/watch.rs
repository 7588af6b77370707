//! The publisher watches its pool's ResourceSlices on the FakeApiServer
//! test double: a change behind its back is put right at once (not at the
//! next resync), bookmarks move the watch on so a compaction does not
//! force a re-list, and a watch whose resourceVersion is gone (410) lists
//! again and goes on watching.

use crate::common::{follow_for_an_hour, NODE};
use fakegpu::FakeHost;
use gpuslice_core::Inventory;
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::publish::{slice_name, SharedPolicy};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_testkit::fakeapi::{shared_claim, FakeApiServer};
use gpuslice_testkit::{wait_until, FAST_PATH_LIMIT};
use std::sync::OnceLock;
use std::time::Duration;

fn inventory() -> Inventory {
    static HOST: OnceLock<FakeHost> = OnceLock::new();
    let h = HOST.get_or_init(|| FakeHost::builder().gpus(2).build().unwrap());
    gpuslice_testkit::fakenvml::discover(h)
}

/// Feeds that `follow` keeps reading while they live.
type Feeds = (
    tokio::sync::watch::Sender<Inventory>,
    tokio::sync::watch::Sender<gpuslice_health::Snapshot>,
);

/// Starts `follow` (resync: an hour, so only the watch can act) and waits
/// for the first publication and the first watch. It runs while its feeds
/// live.
async fn start(fake: &FakeApiServer) -> (tokio::task::JoinHandle<()>, Feeds) {
    let api = KubeApi::new(&fake.url, None).unwrap();
    let (inv_tx, inv_rx) = tokio::sync::watch::channel(inventory());
    let (health_tx, health_rx) = tokio::sync::watch::channel(Default::default());
    let task = follow_for_an_hour(api, SharedPolicy::default(), inv_rx, health_rx);
    let name = slice_name(NODE, DRIVER_NAME, 0);
    wait_until(
        "first publication and watch",
        Duration::from_secs(10),
        || fake.slices().contains_key(&name) && !fake.watch_starts().is_empty(),
    )
    .await;
    (task, (inv_tx, health_tx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_changed_behind_its_back_are_put_right_at_once() {
    let fake = FakeApiServer::start().await;
    let (task, _feeds) = start(&fake).await;
    let name = slice_name(NODE, DRIVER_NAME, 0);
    let devices = |f: &FakeApiServer| {
        f.slices().get(&name).map_or(0, |s| {
            s["spec"]["devices"].as_array().map_or(0, |d| d.len())
        })
    };
    let all = devices(&fake);
    fake.touch_slice(&name, |s| {
        s["spec"]["devices"].as_array_mut().unwrap().pop();
    });
    wait_until("an edited slice put right", FAST_PATH_LIMIT, || {
        devices(&fake) == all
    })
    .await;
    fake.remove_slice(&name);
    wait_until("a deleted slice put back", FAST_PATH_LIMIT, || {
        devices(&fake) == all
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_carry_the_watch_past_a_compaction_without_a_relist() {
    let fake = FakeApiServer::start().await;
    fake.set_bookmark_interval(Duration::from_millis(20));
    let (task, _feeds) = start(&fake).await;
    // Other objects change: the revision moves, no slice event comes,
    // only bookmarks tell the watch how far it is.
    for i in 0..5 {
        fake.put_claim(shared_claim(
            "ns",
            &format!("c{i}"),
            "u",
            NODE,
            0,
            "1Gi",
            "1",
        ));
    }
    let now = fake.revision();
    // Let a bookmark at `now` arrive, with slack for a loaded machine.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lists = fake.lists();
    fake.compact();
    fake.close_watches();
    wait_until("the watch taken up again", Duration::from_secs(5), || {
        fake.watch_starts().len() >= 2
    })
    .await;
    let starts = fake.watch_starts();
    assert_eq!(starts[1], now.to_string(), "{starts:?}");
    assert_eq!(fake.lists(), lists, "no re-list was needed");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_history_is_gone_lists_again_and_watches_on() {
    let fake = FakeApiServer::start().await;
    let (task, _feeds) = start(&fake).await;
    let lists = fake.lists();
    fake.expire_watches();
    wait_until("a re-list and a new watch", Duration::from_secs(5), || {
        fake.lists() > lists && fake.watch_starts().len() >= 2
    })
    .await;
    let starts = fake.watch_starts();
    assert_eq!(
        starts.last().unwrap(),
        &fake.revision().to_string(),
        "the new watch starts from the new list: {starts:?}"
    );
    // And it works: a deletion is put right at once.
    let name = slice_name(NODE, DRIVER_NAME, 0);
    fake.remove_slice(&name);
    wait_until("a deleted slice put back", FAST_PATH_LIMIT, || {
        fake.slices().contains_key(&name)
    })
    .await;
    task.abort();
}
