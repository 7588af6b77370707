//! What a node's devices are, as the publisher of its ResourceSlices and
//! the health streams to the kubelet follow it: its GPUs (changed by
//! hot-plug), their XIDs (the XID watcher) and whether it can enforce its
//! slices' caps.

use crate::policy::SharedPolicy;
use gpuslice_core::Inventory;
use gpuslice_health::Snapshot;
use tokio::sync::watch;

/// Why this node cannot enforce the caps of its slices (None: it can).
/// The shim missing, or not root's, is one such reason: a shared claim's
/// memory cap and compute share would not hold
/// (`crate::daemon::enforcement_problem`).
pub type Enforcement = Option<String>;

/// The node's devices as they change.
#[derive(Clone)]
pub struct NodeFeed {
    /// The pool's name: the node's.
    pub pool: String,
    pub policy: SharedPolicy,
    pub inventory: watch::Receiver<Inventory>,
    pub xids: watch::Receiver<Snapshot>,
    pub enforcement: watch::Receiver<Enforcement>,
}

impl NodeFeed {
    /// A feed of `inventory` and `xids` on a node that always enforces its
    /// slices (no shim to watch: tests and benchmarks).
    pub fn enforced(
        pool: &str,
        policy: SharedPolicy,
        inventory: watch::Receiver<Inventory>,
        xids: watch::Receiver<Snapshot>,
    ) -> Self {
        NodeFeed {
            pool: pool.into(),
            policy,
            inventory,
            xids,
            enforcement: watch::channel(None).1,
        }
    }

    /// A feed that never changes: `inv`'s GPUs, no XID watching, enforced.
    /// (The senders are dropped: followers see the state once and on their
    /// own timers.)
    pub fn fixed(pool: &str, policy: SharedPolicy, inv: Inventory) -> Self {
        Self::enforced(
            pool,
            policy,
            watch::channel(inv).1,
            watch::channel(Snapshot::default()).1,
        )
    }
}
