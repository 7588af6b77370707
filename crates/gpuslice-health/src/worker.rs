//! A plugin's background thread (the health watcher; root's enforcer in
//! gpuslice-k8s runs on one too):
//! told to stop and joined when its owner drops it, so a reloaded config
//! never leaves the old one running.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The thread and its stop flag; stopped and joined when dropped.
pub struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts thread `name` running `body`, which returns once the flag it
    /// is given is set.
    pub fn spawn(
        name: &str,
        body: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Worker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))?;
        Ok(Worker {
            stop,
            thread: Some(thread),
        })
    }

    /// No thread: what an owner holds when there is nothing to run.
    pub fn none() -> Worker {
        Worker {
            stop: Arc::new(AtomicBool::new(true)),
            thread: None,
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
