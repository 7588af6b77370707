//! `gpuslice dra`'s lifecycle: build the driver on the discovered GPUs,
//! serve it, and stop on SIGTERM or SIGINT (removing the sockets, so the
//! kubelet sees the plugin go). The checkpoint and the claims' CDI specs
//! stay: a restarted plugin takes them up again.

use crate::apiserver::HttpApi;
use crate::driver::{Driver, Options};
use crate::server::{serve, Sockets};
use anyhow::{Context, Result};
use std::sync::Arc;

pub struct DaemonOptions {
    pub driver: Options,
    pub sockets: Sockets,
    pub api: HttpApi,
}

pub fn run(opts: DaemonOptions) -> Result<()> {
    let api = Arc::new(opts.api);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let driver = Arc::new(Driver::new(opts.driver, api)?);
        let prepared = driver.prepared().await.len();
        let served = serve(driver, &opts.sockets)?;
        tracing::info!(
            "serving {} ({} prepared claims from the checkpoint); registration at {}",
            served.dra_socket.display(),
            prepared,
            served.registration_socket.display()
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        drop(served);
        anyhow::Ok(())
    })
}
