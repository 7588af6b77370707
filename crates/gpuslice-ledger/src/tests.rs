use super::*;
use crate::layout::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

const GIB: u64 = 1 << 30;

fn specs(caps: &[u64]) -> Vec<DeviceSpec> {
    caps.iter()
        .enumerate()
        .map(|(i, &cap)| DeviceSpec {
            uuid: format!("GPU-0000000{i}-1111-2222-3333-444444444444"),
            cap,
        })
        .collect()
}

fn temp_ledger(caps: &[u64]) -> (tempfile::TempDir, PathBuf, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s1.ledger");
    let l = Ledger::create(&path, "s1", &specs(caps)).unwrap();
    (dir, path, l)
}

/// Pretends a process `pid` with `start` holds `bytes` on device 0 in slot `i`.
fn fake_slot(l: &Ledger, i: usize, pid: u32, start: u64, bytes: u64) {
    l.slot_word(i, S_STATE)
        .store(word(pid, LIVE), Ordering::SeqCst);
    l.slot_word(i, S_START).store(start, Ordering::SeqCst);
    l.slot_word(i, S_PIDNS)
        .store(procfs::own_pid_namespace(), Ordering::SeqCst);
    l.slot_bytes_word(i, 0).store(bytes, Ordering::SeqCst);
    l.dev(0, D_USED).fetch_add(bytes, Ordering::SeqCst);
}

#[test]
fn layout_is_what_the_docs_say() {
    assert_eq!(FILE_SIZE_V1, 332_032);
    assert_eq!(FILE_SIZE, 334_080);
    const { assert!(C_DELAYED + 8 <= COMPUTE_SIZE) };
    assert_eq!(SLOTS_OFF, 4352);
    const { assert!(S_BYTES + MAX_DEVICES * 8 <= SLOT_SIZE) };
    const { assert!(D_UUID + UUID_LEN <= DEVICE_SIZE) };
    const { assert!(H_RECLAIMED_BYTES + 8 <= HEADER_SIZE) };
}

#[test]
fn create_open_and_read_back() {
    let (_d, path, l) = temp_ledger(&[20 * GIB, UNLIMITED]);
    assert_eq!(l.device_count(), 2);
    assert_eq!(l.slice_id(), "s1");
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666, "usable by non-root processes of the slice");
    let o = Ledger::open(&path).unwrap();
    assert_eq!(o.cap(0), 20 * GIB);
    assert_eq!(o.cap(1), UNLIMITED);
    assert_eq!(o.cap(7), UNLIMITED, "unknown devices are unlimited");
    assert!(o.uuid(1).starts_with("GPU-00000001"));
    let s = o.snapshot();
    assert_eq!(s.devices[0].cap, Some(20 * GIB));
    assert_eq!(s.devices[1].cap, None);
    assert!(s.processes.is_empty());
}

#[test]
fn reservations_stop_at_the_cap_and_are_shared_through_the_file() {
    let (_d, path, a) = temp_ledger(&[10 * GIB]);
    let b = Ledger::open(&path).unwrap();
    let sa = a.attach().unwrap();
    // A second attach of the same process image takes over its slot (as
    // after an exec): one slot per process.
    let sb = b.attach().unwrap();
    assert_eq!(sa, sb);
    assert_eq!(a.snapshot().processes.len(), 1);
    a.reserve(sa, 0, 6 * GIB).unwrap();
    let err = b.reserve(sb, 0, 5 * GIB).unwrap_err();
    assert_eq!(
        err,
        OverCap {
            cap: 10 * GIB,
            used: 6 * GIB
        }
    );
    b.reserve(sb, 0, 4 * GIB).unwrap();
    assert_eq!(a.used(0), 10 * GIB);
    assert!(a.reserve(sa, 0, 1).is_err());
    assert_eq!(b.release(sb, 0, 4 * GIB), 4 * GIB);
    assert_eq!(a.used(0), 6 * GIB);
    // A release never takes more than the slot holds.
    assert_eq!(b.release(sb, 0, 7 * GIB), 6 * GIB);
    assert_eq!(b.release(sb, 0, GIB), 0);
    assert_eq!(a.used(0), 0);
    assert_eq!(a.peak(0), 10 * GIB);
    let snap = a.snapshot();
    assert_eq!(snap.devices[0].refusals, 2);
    a.reserve(sa, 0, GIB).unwrap();
    a.detach(sa);
    assert_eq!(a.used(0), 0);
    assert!(a.snapshot().processes.is_empty());
    // The takeover counted as a reclaim; the detach did not.
    assert_eq!(a.snapshot().reclaimed_slots, 1);
}

#[test]
fn unchecked_charges_pass_the_cap_and_block_later_reservations() {
    let l = Ledger::private("p", &specs(&[GIB])).unwrap();
    let s = l.attach().unwrap();
    l.charge_unchecked(s, 0, GIB + 5);
    assert_eq!(l.used(0), GIB + 5);
    assert!(l.reserve(s, 0, 1).is_err());
    l.release(s, 0, GIB + 5);
    assert_eq!(l.used(0), 0);
}

#[test]
fn concurrent_threads_never_pass_the_cap() {
    let l = std::sync::Arc::new(Ledger::private("t", &specs(&[1000])).unwrap());
    let slot = l.attach().unwrap();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..20_000u64 {
                    let size = (i * 7 + t * 13) % 97 + 1;
                    if i % 3 != 2 && l.reserve(slot, 0, size).is_ok() {
                        held.push(size);
                    } else if let Some(s) = held.pop() {
                        l.release(slot, 0, s);
                    }
                    assert!(l.used(0) <= 1000);
                }
                for s in held {
                    l.release(slot, 0, s);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(l.used(0), 0);
    assert!(l.peak(0) <= 1000);
}

#[test]
fn a_dead_process_slot_is_reclaimed_by_the_next_attach() {
    let (_d, _p, l) = temp_ledger(&[10 * GIB]);
    // A pid that cannot exist (above pid_max).
    fake_slot(&l, 5, 4_000_000_000, 1, 3 * GIB);
    // Our own pid with a different start time: a reused pid.
    fake_slot(&l, 6, std::process::id(), 1, GIB);
    assert_eq!(l.used(0), 4 * GIB);
    let s = l.attach().unwrap();
    assert_eq!(l.used(0), 0);
    let snap = l.snapshot();
    assert_eq!(snap.reclaimed_slots, 2);
    assert_eq!(snap.reclaimed_bytes, 4 * GIB);
    assert_eq!(snap.processes.len(), 1);
    assert_eq!(snap.processes[0].slot, s.index());
}

/// A slot of another PID namespace is reclaimed only when that namespace
/// is known to be gone: from the initial namespace (which sees every
/// process) when no process is left in it; from elsewhere, never.
#[test]
fn reap_leaves_live_slots_and_judges_foreign_ones_only_when_it_can() {
    let (_d, _p, l) = temp_ledger(&[10 * GIB]);
    let me = std::process::id();
    let start = procfs::stat(me).unwrap().start_time;
    fake_slot(&l, 3, me, start, GIB);
    fake_slot(&l, 4, 4_000_000_000, 1, GIB);
    // A namespace inode no process has: a slice whose namespace is gone.
    l.slot_word(4, S_PIDNS).store(1, Ordering::SeqCst);
    let initial = procfs::own_pid_namespace() == 0xEFFF_FFFC;
    let r = l.reap().unwrap();
    let states: Vec<_> = l
        .snapshot()
        .processes
        .into_iter()
        .map(|p| p.state)
        .collect();
    if initial {
        assert_eq!(r.slots, 1);
        assert_eq!(l.used(0), GIB);
        assert_eq!(states, [ProcessState::Live]);
    } else {
        assert_eq!(r, Reaped::default());
        assert_eq!(l.used(0), 2 * GIB);
        assert_eq!(states, [ProcessState::Live, ProcessState::OtherNamespace]);
    }
}

#[test]
fn attach_reclaims_the_slot_of_this_pids_previous_image() {
    let (_d, _p, l) = temp_ledger(&[10 * GIB]);
    let me = std::process::id();
    let start = procfs::stat(me).unwrap().start_time;
    // Same pid and start time, as after an exec.
    fake_slot(&l, 0, me, start, 2 * GIB);
    let s = l.attach().unwrap();
    assert_eq!(l.used(0), 0);
    assert_eq!(l.slot_bytes(s, 0), 0);
}

#[test]
fn leftovers_of_a_half_done_update_are_repaired_when_alone() {
    let (_d, _p, l) = temp_ledger(&[10 * GIB, 10 * GIB]);
    // Device counted, no slot: a process killed between its two updates.
    l.dev(1, D_USED).store(GIB, Ordering::SeqCst);
    let other = l.attach().unwrap();
    assert_eq!(l.used(1), 0, "repaired by the first attach");
    l.dev(1, D_USED).store(GIB, Ordering::SeqCst);
    l.reserve(other, 0, 5).unwrap();
    // Not alone (our slot holds bytes): nothing repaired.
    assert_eq!(l.reap().unwrap().repaired, 0);
    assert_eq!(l.used(1), GIB);
    l.detach(other);
    assert_eq!(l.reap().unwrap().repaired, 1);
    assert_eq!(l.used(1), 0);
    assert!(l.snapshot().repairs >= 2);
}

/// Creates a good ledger at `p`, sets the `u32` header field at `offset`
/// to `value`, and returns why the file no longer opens.
fn open_with_header_u32(p: &Path, offset: usize, value: u32) -> Error {
    Ledger::create(p, "v", &specs(&[GIB])).unwrap();
    let mut bytes = fs::read(p).unwrap();
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    fs::write(p, &bytes).unwrap();
    Ledger::open(p).err().unwrap()
}

#[test]
fn foreign_and_corrupt_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.ledger");

    fs::write(&p, "hello, this is a text file that is long enough").unwrap();
    let e = Ledger::open(&p).err().unwrap();
    assert!(matches!(e, Error::Foreign { .. }), "{e}");
    assert!(e.to_string().contains("not a gpuslice ledger"), "{e}");

    fs::write(&p, "").unwrap();
    let e = Ledger::open(&p).err().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");

    // A good ledger with a future version.
    let e = open_with_header_u32(&p, H_VERSION, 3);
    assert!(matches!(e, Error::Version { found: 3, .. }), "{e}");
    assert!(e.to_string().contains("version 3"), "{e}");
    assert!(e.to_string().contains("versions 1 and 2"), "{e}");

    // Truncated.
    Ledger::create(&p, "v", &specs(&[GIB])).unwrap();
    let bytes = fs::read(&p).unwrap();
    fs::write(&p, &bytes[..1000]).unwrap();
    let e = Ledger::open(&p).err().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("1000 bytes"), "{e}");

    // Geometry changed.
    let e = open_with_header_u32(&p, H_MAX_SLOTS, 7);
    assert!(e.to_string().contains("max slots is 7"), "{e}");

    // Never completed.
    let e = open_with_header_u32(&p, H_STATE, 0);
    assert!(e.to_string().contains("not marked complete"), "{e}");

    // Missing.
    let e = Ledger::open(&dir.path().join("none.ledger")).err().unwrap();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

#[test]
fn open_or_create_keeps_an_existing_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k.ledger");
    let a = Ledger::open_or_create(&p, "k", &specs(&[GIB])).unwrap();
    let sa = a.attach().unwrap();
    a.reserve(sa, 0, 100).unwrap();
    let b = Ledger::open_or_create(&p, "k", &specs(&[5 * GIB])).unwrap();
    assert_eq!(b.cap(0), GIB, "the existing file wins");
    assert_eq!(b.used(0), 100);
    // No temporary files left behind.
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn bad_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.ledger");
    assert!(matches!(
        Ledger::create(&p, "a/b", &specs(&[GIB])),
        Err(Error::BadSliceId(_))
    ));
    let many = specs(&[GIB; MAX_DEVICES + 1]);
    assert!(matches!(
        Ledger::create(&p, "a", &many),
        Err(Error::TooManyDevices(33))
    ));
    let l = Ledger::private("a", &specs(&[GIB])).unwrap();
    let s = l.attach().unwrap();
    assert!(l.reserve(s, 3, 1).is_err(), "device index out of range");
}

#[test]
fn read_only_mapping_reads_but_does_not_attach() {
    let (_d, path, l) = temp_ledger(&[GIB]);
    let s = l.attach().unwrap();
    l.reserve(s, 0, 42).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
    // Root ignores file modes; only check when we are not root.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let ro = Ledger::open(&path).unwrap();
        assert!(!ro.writable());
        assert_eq!(ro.used(0), 42);
        assert!(matches!(ro.attach(), Err(Error::ReadOnly)));
    }
}

#[test]
fn dir_helpers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("a/b");
    ensure_dir(&d).unwrap();
    assert_eq!(
        fs::metadata(&d).unwrap().permissions().mode() & 0o7777,
        0o1777
    );
    Ledger::create(&d.join("z.ledger"), "z", &specs(&[GIB])).unwrap();
    Ledger::create(&d.join("a.ledger"), "a", &specs(&[GIB])).unwrap();
    fs::write(d.join("other.txt"), "x").unwrap();
    let names: Vec<_> = list_dir(&d)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a.ledger", "z.ledger"]);
    assert!(valid_slice_id("gs-1234.a_b"));
    assert!(!valid_slice_id(""));
}

/// The ledger directory is writable by every user. What one plants there
/// (a link to a file root would then open read-write and map, a link to a
/// directory of another slice's records, a FIFO) is not listed, and a
/// planted file is not opened by root's readers; the links' targets are
/// valid ledgers, so only the refusal to follow them keeps them out.
#[test]
fn planted_links_and_special_files_are_neither_listed_nor_opened() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("slices");
    ensure_dir(&d).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    let target = elsewhere.join(limits::USAGE_FILE);
    Ledger::create(&target, "victim", &specs(&[GIB])).unwrap();
    std::os::unix::fs::symlink(&target, d.join("link.ledger")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, d.join("linked-dir")).unwrap();
    let fifo =
        std::ffi::CString::new(d.join("fifo.ledger").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    Ledger::create(&d.join("real.ledger"), "real", &specs(&[GIB])).unwrap();
    assert_eq!(list_dir(&d), [d.join("real.ledger")]);
    for planted in ["link.ledger", "fifo.ledger"] {
        let e = Ledger::open(&d.join(planted)).err().unwrap();
        assert!(e.to_string().contains(planted), "{planted}: {e}");
    }
    // The control: the same target opens by its own path.
    assert_eq!(Ledger::open(&target).unwrap().slice_id(), "victim");
}

/// A version-1 file (what an older gpuslice wrote): version 2 without the
/// compute section.
fn write_v1(p: &Path, cap: u64) {
    Ledger::create(p, "old", &specs(&[cap])).unwrap();
    let mut bytes = fs::read(p).unwrap();
    bytes.truncate(FILE_SIZE_V1);
    bytes[H_VERSION..H_VERSION + 4].copy_from_slice(&1u32.to_le_bytes());
    bytes[H_FILE_SIZE..H_FILE_SIZE + 8].copy_from_slice(&(FILE_SIZE_V1 as u64).to_le_bytes());
    fs::write(p, &bytes).unwrap();
}

#[test]
fn version_1_ledgers_are_still_read_without_compute() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("old.ledger");
    write_v1(&p, GIB);
    let l = Ledger::open(&p).unwrap();
    assert_eq!(l.version(), 1);
    let s = l.attach().unwrap();
    l.reserve(s, 0, 1000).unwrap();
    assert_eq!(l.used(0), 1000);
    assert_eq!(l.compute_share(0), 0);
    assert_eq!(l.compute_tokens(0, 5), i64::MAX);
    assert!(matches!(l.set_compute(0, 5000, 1), Err(Error::NoCompute)));
    let snap = l.snapshot();
    assert_eq!(snap.version, 1);
    assert!(snap.compute.is_empty());
}

#[test]
fn the_compute_bucket_refills_at_the_share_and_is_shared() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.ledger");
    let a = Ledger::create(&p, "c", &specs(&[UNLIMITED, UNLIMITED])).unwrap();
    let b = Ledger::open(&p).unwrap();
    assert_eq!(a.compute_share(0), 0);
    a.set_compute(0, 2500, 1_000_000).unwrap();
    assert_eq!(b.compute_share(0), 2500);
    assert_eq!(b.compute_share(1), 0);
    // Starts full; the first refill only stamps the time.
    assert_eq!(b.compute_tokens(0, 1_000_000_000), 1_000_000);
    a.compute_charge(0, 3_000_000);
    assert_eq!(b.compute_tokens(0, 1_000_000_000), -2_000_000);
    // 4 ms of wall at 25 % is 1 ms of GPU time.
    assert_eq!(b.compute_tokens(0, 1_004_000_000), -1_000_000);
    assert_eq!(
        a.compute_tokens(0, 1_012_000_000),
        1_000_000,
        "capped at the burst"
    );
    a.compute_record(0, 3_000_000, 7);
    b.compute_throttled(0, 500);
    let c = &a.snapshot().compute;
    assert_eq!(c.len(), 2);
    assert_eq!(c[0].share_bp, Some(2500));
    assert_eq!((c[0].busy_ns, c[0].launches), (3_000_000, 7));
    assert_eq!((c[0].throttled_ns, c[0].delayed_launches), (500, 1));
    assert_eq!(c[1].share_bp, None);
}

#[test]
fn a_refill_scales_the_live_share_or_borrows_but_never_exceeds_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.ledger");
    let l = Ledger::create(&p, "g", &specs(&[UNLIMITED])).unwrap();
    l.set_compute(0, 2500, 100_000_000).unwrap();
    let borrow = |bp| {
        Some(Refill {
            scale_bp: FULL_SHARE,
            borrow_bp: bp,
        })
    };
    assert_eq!(
        l.compute_tokens_at(0, 1_000_000_000, borrow(9000)),
        100_000_000
    );
    l.compute_charge(0, 200_000_000);
    // 10 ms at a borrowed 90 %: 9 ms back.
    assert_eq!(
        l.compute_tokens_at(0, 1_010_000_000, borrow(9000)),
        -91_000_000
    );
    // Borrowing less than the share refills at the share (2.5 ms per 10 ms).
    assert_eq!(
        l.compute_tokens_at(0, 1_020_000_000, borrow(100)),
        -88_500_000
    );
    // Above 100 % is 100 %.
    assert_eq!(
        l.compute_tokens_at(0, 1_030_000_000, borrow(50_000)),
        -78_500_000
    );
    // Scaled to 80 % of the share: 2 ms per 10 ms.
    let scaled = Some(Refill {
        scale_bp: 8000,
        borrow_bp: 0,
    });
    assert_eq!(l.compute_tokens_at(0, 1_040_000_000, scaled), -76_500_000);
    // The scale applies to the share in force now, not the one at start.
    l.set_compute(0, 5000, 100_000_000).unwrap();
    assert_eq!(l.compute_tokens_at(0, 1_050_000_000, scaled), 100_000_000);
    l.compute_charge(0, 200_000_000);
    // 10 ms at 80 % of 50 %: 4 ms back.
    assert_eq!(l.compute_tokens_at(0, 1_060_000_000, scaled), -96_000_000);
    let share_alone = Refill {
        scale_bp: FULL_SHARE,
        borrow_bp: 0,
    };
    assert_eq!(share_alone.rate(3000), 3000);
}

/// The attack: a tenant rewrites its own ledger's cap, share
/// and bucket words (it may write that file). A ledger pinned to the
/// slice's limits record ignores all three.
#[test]
fn a_pinned_ledger_ignores_caps_shares_and_tokens_written_into_the_file() {
    let (_dir, path, l) = temp_ledger(&[GIB]);
    l.set_compute(0, 3000, DEFAULT_BURST_NS).unwrap();
    let limits = limits::SliceLimits {
        slice_id: "s1".into(),
        mode: limits::Mode::Cap,
        devices: vec![limits::DeviceLimits {
            uuid: String::new(),
            memory: Some(limits::MemorySize(GIB)),
            compute: limits::ComputeShare::from_basis_points(3000),
        }],
    };
    let mut pinned = Ledger::open(&path).unwrap();
    pinned.pin(&limits).unwrap();
    // The tenant's writes, through another mapping of the same file.
    l.dev(0, D_CAP).store(8 * GIB, Ordering::SeqCst);
    l.cword(0, C_SHARE).store(FULL_SHARE, Ordering::SeqCst);
    l.cword(0, C_BURST).store(u64::MAX / 2, Ordering::SeqCst);
    l.cword(0, C_TOKENS)
        .store(i64::MAX as u64, Ordering::SeqCst);
    assert_eq!(l.cap(0), 8 * GIB, "the unpinned view reads the file");
    let slot = pinned.attach().unwrap();
    assert!(pinned.reserve(slot, 0, GIB).is_ok());
    assert!(
        pinned.reserve(slot, 0, 1).is_err(),
        "the record's cap holds"
    );
    assert_eq!(pinned.compute_share(0), 3000);
    assert_eq!(pinned.compute_burst(0), DEFAULT_BURST_NS);
    // Forged tokens are worth one bucket at most.
    assert_eq!(
        pinned.compute_tokens(0, 5_000_000_000),
        DEFAULT_BURST_NS as i64
    );
    // Root rewrote the record with another share: the caps stay pinned.
    let mut halved = limits.clone();
    halved.devices[0].compute = limits::ComputeShare::from_basis_points(1500);
    halved.devices[0].memory = Some(limits::MemorySize(8 * GIB));
    pinned.repin_shares(&halved);
    assert_eq!(pinned.compute_share(0), 1500);
    assert_eq!(pinned.cap(0), GIB);
    // A record for another geometry is refused.
    let mut other = Ledger::open(&path).unwrap();
    let mut two = limits.clone();
    two.devices.push(two.devices[0].clone());
    assert!(other.pin(&two).is_err());
    pinned.detach(slot);
}
