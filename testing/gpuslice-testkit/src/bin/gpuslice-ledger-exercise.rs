//! Helper of the ledger's multi-process tests (not a user tool).
//!
//! `gpuslice-ledger-exercise random LEDGER DEVICE SECONDS SEED MAX_BLOCK`:
//! attaches, then reserves and releases blocks at random until SECONDS have
//! passed, checking after every step that the device never passes its cap;
//! releases everything, detaches, prints one JSON line of counts. Exit 3
//! when the cap was seen exceeded.
//!
//! `gpuslice-ledger-exercise hold LEDGER DEVICE BYTES`: attaches, reserves
//! BYTES, prints `held`, and sleeps until killed.
//!
//! `gpuslice-ledger-exercise truncated LEDGER reader|slice`: opens the
//! ledger as root's readers do (`reader`) or as a slice's own process
//! (`slice`), truncates the file to nothing, reads the mapping again and
//! prints `lost=BOOL` (a process the truncation kills prints nothing).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuslice_ledger::Ledger;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.get(1).map(String::as_str) {
        Some("random") if args.len() == 7 => random(&args[2..]),
        Some("hold") if args.len() == 5 => hold(&args[2..]),
        Some("truncated") if args.len() == 4 => truncated(&args[2..]),
        _ => {
            eprintln!(
                "usage: random LEDGER DEV SECONDS SEED MAX_BLOCK | hold LEDGER DEV BYTES | truncated LEDGER reader|slice"
            );
            2
        }
    };
    std::process::exit(code);
}

fn num(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| panic!("not a number: {s}"))
}

fn random(a: &[String]) -> i32 {
    let ledger = Ledger::open_in_slice(Path::new(&a[0])).expect("open ledger");
    let dev = num(&a[1]) as usize;
    let deadline = Instant::now() + Duration::from_secs_f64(a[2].parse().expect("seconds"));
    let mut rng = num(&a[3]) | 1;
    let max_block = num(&a[4]).max(1);
    let slot = ledger.attach().expect("attach");
    let cap = ledger.cap(dev);
    let mut held: Vec<u64> = Vec::with_capacity(64);
    let (mut ok, mut refused, mut released, mut max_seen) = (0u64, 0u64, 0u64, 0u64);
    let mut exceeded = false;
    let mut step = 0u64;
    while !step.is_multiple_of(64) || Instant::now() < deadline {
        step += 1;
        // xorshift64
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng % 100 < 55 && held.len() < 64 {
            let size = (rng >> 8) % max_block + 1;
            match ledger.reserve(slot, dev, size) {
                Ok(()) => {
                    ok += 1;
                    held.push(size);
                }
                Err(_) => refused += 1,
            }
        } else if !held.is_empty() {
            let i = (rng >> 16) as usize % held.len();
            let size = held.swap_remove(i);
            released += ledger.release(slot, dev, size);
        }
        let used = ledger.used(dev);
        max_seen = max_seen.max(used);
        if used > cap {
            exceeded = true;
        }
    }
    for size in held {
        released += ledger.release(slot, dev, size);
    }
    let left = ledger.slot_bytes(slot, dev);
    ledger.detach(slot);
    println!(
        "{{\"pid\":{},\"reserved\":{ok},\"refused\":{refused},\"released_bytes\":{released},\"max_seen\":{max_seen},\"cap\":{cap},\"left\":{left},\"exceeded\":{exceeded}}}",
        std::process::id()
    );
    if exceeded {
        3
    } else {
        0
    }
}

fn hold(a: &[String]) -> i32 {
    let ledger = Ledger::open_in_slice(Path::new(&a[0])).expect("open ledger");
    let dev = num(&a[1]) as usize;
    let slot = ledger.attach().expect("attach");
    ledger.reserve(slot, dev, num(&a[2])).expect("reserve");
    println!("held");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn truncated(a: &[String]) -> i32 {
    let path = Path::new(&a[0]);
    let ledger = match a[1].as_str() {
        "reader" => Ledger::open(path),
        _ => Ledger::open_in_slice(path),
    }
    .expect("open ledger");
    let before = ledger.snapshot();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(0))
        .expect("truncate");
    let after = ledger.snapshot();
    println!(
        "lost={} slice_before={} slice_after={:?}",
        ledger.lost(),
        before.slice_id,
        after.slice_id
    );
    0
}
