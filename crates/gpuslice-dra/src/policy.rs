//! The request policy of the GPUs' consumable capacity the DRA driver
//! publishes (`--memory-step`), and the compute a request that names none
//! is counted for. Apart from `publish` so that the node's feed, which
//! carries the policy, and the publication, which reads the feed, do not
//! import each other.

use thiserror::Error;

pub(crate) const MIB: u64 = 1 << 20;

/// What the scheduler counts for a request that names no compute: the
/// least it can count. Such a claim gets no share on the node (best
/// effort: `crate::claim`), so counting the whole GPU, as a default of
/// 100 did, only kept every other claim off it.
pub const BEST_EFFORT_COMPUTE: u64 = 1;

/// The request policy of the GPUs' consumable capacity. The defaults are
/// fixed: all of the memory (a request naming no capacity is the whole
/// GPU) and [`BEST_EFFORT_COMPUTE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPolicy {
    /// Memory is consumed in multiples of this (bytes; a multiple of 1 MiB).
    pub memory_step: u64,
}

impl Default for SharedPolicy {
    fn default() -> Self {
        SharedPolicy { memory_step: MIB }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("memory step {0} B: a positive multiple of 1 MiB (1048576 B) is required")]
    Step(u64),
}

impl SharedPolicy {
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.memory_step == 0 || !self.memory_step.is_multiple_of(MIB) {
            return Err(PolicyError::Step(self.memory_step));
        }
        Ok(())
    }

    /// The memory a GPU of `total` bytes offers: whole steps of it.
    pub fn usable_memory(&self, total: u64) -> u64 {
        total / self.memory_step * self.memory_step
    }
}
