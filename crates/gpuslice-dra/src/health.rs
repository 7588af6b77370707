//! Device health to the kubelet: `DRAResourceHealth.NodeWatchResources`
//! (`k8s.io/kubelet/pkg/apis/dra-health`, served in v1alpha1, v1beta1 and
//! v1 on the DRA socket), from which the kubelet fills a pod's
//! `status.containerStatuses[].allocatedResourcesStatus`.
//!
//! Every device of the pool is reported, the complete list at the start of
//! a stream, on every change and every [`REFRESH`] (the kubelet turns a
//! device it has not heard of within its timeout to Unknown):
//! - Unhealthy: its GPU had a critical XID (the XID watcher of
//!   `gpuslice_health`, as the ResourceSlices' taints), or the
//!   node cannot enforce its slices (see [`Enforcement`]);
//! - Unknown: no XID watching (no NVML, or events unsupported), so nothing
//!   is known;
//! - Healthy otherwise.

use crate::feed::NodeFeed;
use crate::publish::{devices, SharedPolicy};
use gpuslice_core::Inventory;
use gpuslice_health::Snapshot;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often the full list is sent again without a change.
pub const REFRESH: Duration = Duration::from_secs(10);

pub use crate::feed::Enforcement;

/// A device's health as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    pub device: String,
    pub health: Health,
    /// Why, when not Healthy.
    pub message: String,
}

/// The health of every device `inv` offers.
pub fn device_health(
    inv: &Inventory,
    policy: &SharedPolicy,
    xids: &Snapshot,
    unenforced: &Enforcement,
) -> Vec<DeviceHealth> {
    devices(inv, policy)
        .into_iter()
        .map(|d| {
            let gpu = crate::claim::DeviceKind::parse(&d.name).map(|k| k.gpu());
            let (health, message) = if let Some(why) = gpu.and_then(|g| xids.unhealthy.get(&g)) {
                (Health::Unhealthy, format!("GPU unhealthy: {why}"))
            } else if let Some(why) = unenforced {
                (Health::Unhealthy, format!("slices not enforced: {why}"))
            } else if xids.watching != "events" {
                let why = if xids.watching.is_empty() {
                    "the XID watcher has not started"
                } else {
                    xids.watching.as_str()
                };
                (Health::Unknown, format!("no XID watching: {why}"))
            } else {
                (Health::Healthy, String::new())
            };
            DeviceHealth {
                device: d.name,
                health,
                message,
            }
        })
        .collect()
}

/// The health of every device `feed` describes now.
fn now(feed: &NodeFeed) -> Vec<DeviceHealth> {
    device_health(
        &feed.inventory.borrow(),
        &feed.policy,
        &feed.xids.borrow(),
        &feed.enforcement.borrow(),
    )
}

/// A health stream's updates: the complete list now, then on every change
/// and every [`REFRESH`], until the receiver is dropped (the kubelet
/// closed the stream).
pub fn follow(mut feed: NodeFeed) -> mpsc::Receiver<Vec<DeviceHealth>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            if tx.send(now(&feed)).await.is_err() {
                return;
            }
            // A closed sender (a fixed feed) never wakes its arm.
            tokio::select! {
                Ok(()) = feed.inventory.changed() => {}
                Ok(()) = feed.xids.changed() => {}
                Ok(()) = feed.enforcement.changed() => {}
                _ = tokio::time::sleep(REFRESH) => {}
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A device's entry in version `$ver`'s message; `$extra` names the fields
/// that version adds beyond v1alpha1's (its timeout and message).
macro_rules! device_entry {
    ($ver:ident $(, $extra:ident)?) => {
        |pool: &str, d: DeviceHealth, now: i64| {
            use crate::api::health::$ver as api;
            let health = match d.health {
                Health::Unknown => api::HealthStatus::Unknown,
                Health::Healthy => api::HealthStatus::Healthy,
                Health::Unhealthy => api::HealthStatus::Unhealthy,
            };
            // v1alpha1 has no more fields; later versions add theirs below.
            #[allow(unused_mut, clippy::needless_update)]
            let mut e = api::DeviceHealth {
                device: Some(api::DeviceIdentifier {
                    pool_name: pool.into(),
                    device_name: d.device,
                }),
                health: health.into(),
                last_updated_time: now,
                ..Default::default()
            };
            // The API's limit on a message.
            $( e.$extra = d.message.chars().take(1024).collect(); )?
            e
        }
    };
}

/// The health service of one API version around [`NodeFeed`].
macro_rules! health_service {
    ($ver:ident $(, $extra:ident)?) => {
        pub mod $ver {
            use super::*;
            use crate::api::health::$ver as api;
            use api::dra_resource_health_server::{DraResourceHealth, DraResourceHealthServer};
            use tokio_stream::wrappers::ReceiverStream;
            use tokio_stream::StreamExt;
            use tonic::{Request, Response, Status};

            pub struct Service(pub NodeFeed);

            fn response(pool: &str, list: Vec<DeviceHealth>) -> api::NodeWatchResourcesResponse {
                let now = unix_now();
                let entry = device_entry!($ver $(, $extra)?);
                api::NodeWatchResourcesResponse {
                    devices: list.into_iter().map(|d| entry(pool, d, now)).collect(),
                }
            }

            type Updates = std::pin::Pin<
                Box<
                    dyn tokio_stream::Stream<Item = Result<api::NodeWatchResourcesResponse, Status>>
                        + Send,
                >,
            >;

            // tonic's Status is the stream's error type, as generated.
            #[allow(clippy::result_large_err)]
            #[tonic::async_trait]
            impl DraResourceHealth for Service {
                type NodeWatchResourcesStream = Updates;

                async fn node_watch_resources(
                    &self,
                    _: Request<api::NodeWatchResourcesRequest>,
                ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                    let pool = self.0.pool.clone();
                    let updates = ReceiverStream::new(follow(self.0.clone()))
                        .map(move |list| Ok(response(&pool, list)));
                    Ok(Response::new(Box::pin(updates)))
                }
            }

            pub fn server(feed: NodeFeed) -> DraResourceHealthServer<Service> {
                DraResourceHealthServer::new(Service(feed))
            }
        }
    };
}

health_service!(v1alpha1);
health_service!(v1beta1, message);
health_service!(v1, message);

#[cfg(test)]
mod tests {
    use super::*;

    fn of<'a>(list: &'a [DeviceHealth], device: &str) -> &'a DeviceHealth {
        list.iter().find(|d| d.device == device).unwrap()
    }

    #[test]
    fn xids_enforcement_and_no_watching_each_show() {
        let policy = SharedPolicy::default();
        let mut xids = Snapshot {
            watching: "events".into(),
            ..Snapshot::default()
        };
        let list = device_health(&Inventory::fake(2), &policy, &xids, &None);
        assert!(list.iter().all(|d| d.health == Health::Healthy), "{list:?}");

        xids.unhealthy.insert(1, "XID 79".into());
        let list = device_health(&Inventory::fake(2), &policy, &xids, &None);
        assert_eq!(of(&list, "gpu-0").health, Health::Healthy);
        let sick = of(&list, "gpu-1");
        assert_eq!(sick.health, Health::Unhealthy);
        assert!(sick.message.contains("XID 79"), "{sick:?}");

        let list = device_health(
            &Inventory::fake(2),
            &policy,
            &xids,
            &Some("the shim is missing".into()),
        );
        assert_eq!(of(&list, "gpu-0").health, Health::Unhealthy);
        assert!(of(&list, "gpu-0").message.contains("the shim is missing"));
        assert!(of(&list, "gpu-1").message.contains("XID 79"));

        let list = device_health(&Inventory::fake(1), &policy, &Snapshot::default(), &None);
        assert_eq!(of(&list, "gpu-0").health, Health::Unknown);
        assert!(of(&list, "gpu-0").message.contains("no XID watching"));
    }
}
