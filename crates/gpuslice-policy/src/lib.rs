//! gpuslice-policy: who may run `gpuslice run` on behalf of whom, with
//! which GPUs and limits.
//!
//! A `gpuslice` that runs as root for another user (through sudo, or
//! installed setuid root) is that user's way to root: without a policy,
//! `sudo gpuslice run --gpus 0 -- bash` is a root shell. So:
//! - [`caller`] says whose request it is (root, a sudo caller, the real
//!   user of a setuid install, or an unprivileged user running it plainly);
//! - [`file`](mod@file) loads the admin's policy (`/etc/gpuslice/policy.toml`) only
//!   from a root-owned, non-writable file, with errors that name the field;
//! - [`check`] decides one request against it, failing closed: no policy
//!   file, no rule for the caller, or a rule not met, and the run is refused.

#![forbid(unsafe_code)]

pub mod caller;
pub mod check;
pub mod file;

pub use caller::{Caller, CallerError, Via, ROOT_ONLY_ENV};
pub use check::{Member, Refusal, Request};
pub use file::{Distrust, Policy, PolicyError, RootEnforcer, Rule, UnshimmedAction};
