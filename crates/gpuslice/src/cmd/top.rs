//! `gpuslice top`: a live view of the GPUs and their slices, in the style
//! of nvtop and htop (ratatui on crossterm), refreshed each second; `q`
//! quits, `--once` prints one plain snapshot.
//!
//! It reads what `gpuslice slices` and the exporter read, with their code
//! and no daemon of its own: the slices from [`super::slices::snapshot`]
//! (ledgers, limits records, the enforcement check of each process, DRA
//! claims), the GPUs from discovery and NVML through
//! [`gpuslice_metrics::gpu::telemetry`] (under discovery's host-root
//! rule). What it adds is the rate: a slice's share of GPU time and its
//! throttling over the last interval, from two readings of its ledger.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::{HostRoot, Inventory};
use gpuslice_metrics::gpu::Telemetry;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use serde_json::Value;

use crate::global::Global;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one plain snapshot (its rates over one second) and exit, instead of the live view.
    #[arg(long)]
    pub once: bool,
}

/// How often the view is refreshed.
const REFRESH: Duration = Duration::from_secs(1);
/// Cells of a bar.
const BAR: usize = 20;

pub fn run(global: &Global, args: &TopArgs) -> Result<i32> {
    if global.json {
        bail!("top has no JSON form: `gpuslice slices --json` gives the slices, the exporter the GPUs");
    }
    let mut sampler = Sampler::new(global);
    if args.once {
        sampler.sample();
        std::thread::sleep(REFRESH);
        let frame = sampler.sample();
        for line in frame.lines() {
            println!("{}", plain(&line));
        }
        return Ok(0);
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        bail!("top needs a terminal (for one plain snapshot: gpuslice top --once)");
    }
    let mut terminal = ratatui::try_init()?;
    let shown = live(&mut terminal, &mut sampler);
    ratatui::restore();
    shown?;
    Ok(0)
}

fn live(terminal: &mut ratatui::DefaultTerminal, sampler: &mut Sampler) -> Result<()> {
    loop {
        let frame = sampler.sample();
        let next = Instant::now() + REFRESH;
        loop {
            terminal.draw(|f| {
                let block = Block::bordered().title(Line::from(vec![
                    Span::styled(" gpuslice top ", Style::new().add_modifier(Modifier::BOLD)),
                    Span::raw("─ q quits "),
                ]));
                f.render_widget(Paragraph::new(frame.lines()).block(block), f.area());
            })?;
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() || !event::poll(left)? {
                break;
            }
            match event::read()? {
                Event::Key(k) if k.kind == KeyEventKind::Press => {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
                // A resize (or another event) redraws the same frame.
                _ => {}
            }
        }
    }
}

/// Where the GPUs' facts come from: discovery once, NVML where
/// discovery's rule allows it (as the exporter).
struct Sampler {
    global: Global,
    inventory: Option<Inventory>,
    nvml: Option<nvml_wrapper::Nvml>,
    /// Why there is no per-GPU telemetry.
    no_nvml: Option<String>,
    /// Per slice and device: (busy ns, throttled ns) at `last`.
    prev: HashMap<(String, u64), (u64, u64)>,
    last: Option<Instant>,
}

impl Sampler {
    fn new(global: &Global) -> Sampler {
        let mut opts = DiscoverOptions {
            pci_details: false,
            ..Default::default()
        };
        // A simulated host with its fake driver (`gpuslice-fakehost --driver`): its
        // NVML describes that host, as a real host's NVML describes `/`.
        if std::env::var_os(gpuslice_core::discover::FAKEGPU_ROOT_ENV).is_none() {
            // Before any thread: nothing here has started one.
            if let Some(lib) = gpuslice_core::simulation::use_driver_nvml(&global.host_root) {
                opts.nvml_lib = Some(lib);
            }
        }
        let mut s = Sampler {
            global: global.clone(),
            inventory: None,
            nvml: None,
            no_nvml: None,
            prev: HashMap::new(),
            last: None,
        };
        match discover(&HostRoot::new(&global.host_root), &opts) {
            Ok(inv) => {
                if inv.sources.iter().any(|x| x == "nvml") {
                    match gpuslice_cuda_load::open_nvml(opts.nvml_lib.as_deref()) {
                        Ok(n) => s.nvml = Some(n),
                        Err(e) => s.no_nvml = Some(format!("NVML unavailable: {e}")),
                    }
                } else {
                    s.no_nvml = inv.nvml_error.clone();
                }
                s.inventory = Some(inv);
            }
            Err(e) => s.no_nvml = Some(e.to_string()),
        }
        s
    }

    fn sample(&mut self) -> Frame {
        let snap = super::slices::snapshot(&self.global);
        let now = Instant::now();
        let interval = self.last.map(|t| now.duration_since(t).as_secs_f64());
        let gpus = self
            .inventory
            .iter()
            .flat_map(|inv| &inv.gpus)
            .map(|g| GpuView {
                index: g.index,
                model: g.model.clone(),
                memory_bytes: g.memory_bytes,
                telemetry: self
                    .nvml
                    .as_ref()
                    .and_then(|n| gpuslice_metrics::gpu::telemetry(n, g)),
            })
            .collect();
        let mut prev = HashMap::new();
        let slices = snap["slices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let v = self.slice_view(s, interval);
                for d in &v.devices {
                    prev.insert((v.id.clone(), d.index), (d.busy_ns, d.throttled_ns));
                }
                v
            })
            .collect();
        self.prev = prev;
        self.last = Some(now);
        Frame {
            host_root: self.global.host_root.clone(),
            simulation: super::slices::simulation_note(&self.global),
            no_nvml: self.no_nvml.clone(),
            gpus,
            slices,
            dra: snap["dra_claims"].as_array().cloned().unwrap_or_default(),
            interval,
        }
    }

    fn slice_view(&self, s: &Value, interval: Option<f64>) -> SliceView {
        let id = text(&s["slice"]);
        let gpu_of = |uuid: &str| {
            self.inventory
                .as_ref()
                .and_then(|inv| gpuslice_metrics::slices::gpu_of(inv, uuid))
        };
        let compute: Vec<&Value> = s["compute"].as_array().into_iter().flatten().collect();
        let devices = s["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                let index = d["index"].as_u64().unwrap_or(0);
                let c = compute.iter().find(|c| c["index"].as_u64() == Some(index));
                let field = |k: &str| c.and_then(|c| c[k].as_u64()).unwrap_or(0);
                let (busy_ns, throttled_ns) = (field("busy_ns"), field("throttled_ns"));
                let earlier = self.prev.get(&(id.clone(), index));
                // Over the last interval; on the first reading, since the
                // slice started (what `slices` says).
                let (got, throttled) = match (earlier, interval) {
                    (Some(&(b, t)), Some(secs)) if secs > 0.0 => (
                        Some(100.0 * busy_ns.saturating_sub(b) as f64 / 1e9 / secs),
                        Some(throttled_ns.saturating_sub(t) as f64 / 1e9 / secs),
                    ),
                    _ => (c.and_then(|c| c["use_percent"].as_f64()), None),
                };
                DevView {
                    index,
                    gpu: gpu_of(d["uuid"].as_str().unwrap_or("")),
                    used: d["used_bytes"].as_u64().unwrap_or(0),
                    cap: d["cap_bytes"].as_u64(),
                    peak: d["peak_bytes"].as_u64().unwrap_or(0),
                    refusals: d["refusals"].as_u64().unwrap_or(0),
                    share: c.and_then(|c| c["share_percent"].as_f64()),
                    mode: c.and_then(|c| c["mode"].as_str()).map(str::to_string),
                    got,
                    measured: earlier.is_some() && interval.is_some(),
                    busy_ns,
                    throttled_ns,
                    throttled_per_s: throttled,
                }
            })
            .collect();
        let processes = s["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| ProcView {
                pid: p["pid"].as_u64().unwrap_or(0),
                name: text(&p["name"]),
                state: text(&p["state"]),
                bytes: p["bytes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_u64)
                    .collect(),
                enforced: p["enforced"].as_bool(),
            })
            .collect();
        let unenforced = s["unenforced"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| format!("{} {}", p["pid"], text(&p["name"])))
            .collect();
        SliceView {
            id,
            error: s.get("error").map(text),
            limits: text(&s["limits"]),
            devices,
            processes,
            unenforced,
            attach_failures: s["attach_failures"].as_u64().unwrap_or(0),
        }
    }
}

/// A JSON string as terminal-safe text (a slice names itself and its
/// processes: no control characters reach the terminal).
fn text(v: &Value) -> String {
    v.as_str()
        .unwrap_or("?")
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

struct Frame {
    host_root: PathBuf,
    simulation: Option<String>,
    no_nvml: Option<String>,
    gpus: Vec<GpuView>,
    slices: Vec<SliceView>,
    dra: Vec<Value>,
    /// Seconds since the previous reading.
    interval: Option<f64>,
}

struct GpuView {
    index: u32,
    model: String,
    memory_bytes: Option<u64>,
    telemetry: Option<Telemetry>,
}

struct SliceView {
    id: String,
    error: Option<String>,
    limits: String,
    devices: Vec<DevView>,
    processes: Vec<ProcView>,
    unenforced: Vec<String>,
    attach_failures: u64,
}

struct DevView {
    index: u64,
    /// The host's GPU index.
    gpu: Option<u32>,
    used: u64,
    cap: Option<u64>,
    peak: u64,
    refusals: u64,
    share: Option<f64>,
    mode: Option<String>,
    /// % of GPU time: over the last interval when `measured`, else since start.
    got: Option<f64>,
    measured: bool,
    busy_ns: u64,
    throttled_ns: u64,
    /// Seconds of throttling per second, over the last interval.
    throttled_per_s: Option<f64>,
}

struct ProcView {
    pid: u64,
    name: String,
    state: String,
    bytes: Vec<u64>,
    enforced: Option<bool>,
}

fn gib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 30) as f64)
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
}

/// `[█████░░░░|░░░░]`: `value` % filled, `target` % (if any) marked `|`.
fn bar(value: f64, target: Option<f64>, fill: Color) -> Vec<Span<'static>> {
    let cells = |pct: f64| ((pct.clamp(0.0, 100.0) / 100.0) * BAR as f64).round() as usize;
    let filled = cells(value);
    let mark = target.map(|t| cells(t).min(BAR - 1));
    let mut spans = vec![Span::raw("[")];
    for i in 0..BAR {
        let (ch, style) = match (i < filled, Some(i) == mark) {
            (true, true) => ("█", Style::new().fg(Color::Yellow)),
            (true, false) => ("█", Style::new().fg(fill)),
            (false, true) => ("|", Style::new().fg(Color::Yellow)),
            (false, false) => ("░", Style::new().fg(Color::DarkGray)),
        };
        spans.push(Span::styled(ch, style));
    }
    spans.push(Span::raw("]"));
    spans
}

fn bold(s: String) -> Span<'static> {
    Span::styled(s, Style::new().add_modifier(Modifier::BOLD))
}

impl Frame {
    /// The view, line by line: the live view draws them styled, `--once`
    /// prints their text.
    fn lines(&self) -> Vec<Line<'static>> {
        let mut out = Vec::new();
        let head = format!("host root {}", self.host_root.display());
        let mut first = vec![Span::raw(head)];
        if self.simulation.is_some() {
            first.push(Span::raw("  "));
            first.push(Span::styled(
                "SIMULATION (gpuslice-fakehost)",
                Style::new().fg(Color::Black).bg(Color::Yellow),
            ));
        }
        if let Some(secs) = self.interval {
            first.push(Span::raw(format!("  rates over the last {secs:.1} s")));
        }
        out.push(Line::from(first));
        out.push(Line::from(""));
        out.push(Line::from(bold(format!(
            "{:<4} {:<14} {:<27} {}",
            "GPU", "MODEL", "UTIL", "MEMORY USED / TOTAL"
        ))));
        for g in &self.gpus {
            let t = g.telemetry.unwrap_or_default();
            let mut spans = vec![Span::raw(format!("{:<4} {:<14} ", g.index, g.model))];
            match t.util_percent {
                Some(u) => {
                    spans.extend(bar(f64::from(u), None, Color::Green));
                    spans.push(Span::raw(format!(" {u:>3}% ")));
                }
                None => spans.push(Span::raw(format!("{:<27}", "-"))),
            }
            let total = t.memory_total.or(g.memory_bytes);
            match (t.memory_used, total) {
                (Some(used), Some(total)) if total > 0 => {
                    spans.extend(bar(100.0 * used as f64 / total as f64, None, Color::Cyan));
                    spans.push(Span::raw(format!(" {} / {} GiB", gib(used), gib(total))));
                }
                (_, Some(total)) => spans.push(Span::raw(format!("- / {} GiB", gib(total)))),
                _ => spans.push(Span::raw("-")),
            }
            out.push(Line::from(spans));
        }
        if let Some(why) = &self.no_nvml {
            out.push(Line::from(Span::styled(
                format!("no utilisation or memory use: {why}"),
                Style::new().fg(Color::DarkGray),
            )));
        }
        out.push(Line::from(""));
        if self.slices.is_empty() && self.dra.is_empty() {
            out.push(Line::from("no slices with a memory cap or compute share"));
        }
        for s in &self.slices {
            self.slice_lines(s, &mut out);
        }
        for d in &self.dra {
            out.push(Line::from(format!(
                "slice {} (DRA claim {}/{}): gpu {} {}",
                text(&d["slice"]),
                text(&d["claim_namespace"]),
                text(&d["claim_name"]),
                d["gpu"],
                text(&d["device"]),
            )));
        }
        if let Some(note) = &self.simulation {
            out.push(Line::from(""));
            out.push(Line::from(note.clone()));
        }
        out
    }

    fn slice_lines(&self, s: &SliceView, out: &mut Vec<Line<'static>>) {
        if let Some(e) = &s.error {
            out.push(Line::from(format!("slice ?: {e}")));
            return;
        }
        let live: Vec<&ProcView> = s
            .processes
            .iter()
            .filter(|p| p.state != "transient")
            .collect();
        let held = live.iter().filter(|p| p.enforced == Some(true)).count();
        let status = if !s.unenforced.is_empty() {
            Span::styled(
                format!("NOT ENFORCED: {}", s.unenforced.join(", ")),
                Style::new().fg(Color::White).bg(Color::Red),
            )
        } else if s.limits.starts_with("unusable") {
            Span::styled(format!("limits {}", s.limits), Style::new().fg(Color::Red))
        } else {
            Span::styled(
                format!(
                    "enforced: {held} of {} processes ({})",
                    live.len(),
                    s.limits
                ),
                Style::new().fg(Color::Green),
            )
        };
        out.push(Line::from(vec![
            bold(format!("slice {}", s.id)),
            Span::raw("  "),
            status,
        ]));
        for d in &s.devices {
            let gpu = d.gpu.map_or_else(|| "?".into(), |g| g.to_string());
            if let Some(share) = d.share {
                let got = d.got.unwrap_or(0.0);
                let over = got > share * 1.05 + 1.0;
                let mode = d.mode.as_deref().unwrap_or("cap");
                let mut spans = vec![Span::raw(format!(
                    "  gpu {gpu:<3} compute {:>3}% {mode:<10} ",
                    share.round()
                ))];
                spans.extend(bar(
                    got,
                    Some(share),
                    if over { Color::Red } else { Color::Green },
                ));
                spans.push(Span::raw(format!(
                    " {got:5.1}% of GPU time{}",
                    if d.measured { "" } else { " since start" }
                )));
                match d.throttled_per_s {
                    Some(t) if t > 0.0 => spans.push(Span::styled(
                        format!("  throttled {t:.2} s/s"),
                        Style::new().fg(Color::Yellow),
                    )),
                    Some(_) => spans.push(Span::raw("  not throttled")),
                    None => spans.push(Span::raw(format!(
                        "  throttled {:.1} s",
                        d.throttled_ns as f64 / 1e9
                    ))),
                }
                out.push(Line::from(spans));
            }
            let cap = d
                .cap
                .map_or_else(|| "no cap".into(), |c| format!("cap {}", mib(c)));
            let mut spans = vec![Span::raw(format!(
                "  gpu {gpu:<3} memory {} / {cap}  (peak {}",
                mib(d.used),
                mib(d.peak)
            ))];
            if d.refusals > 0 {
                spans.push(Span::raw(", "));
                spans.push(Span::styled(
                    format!("refused {}", d.refusals),
                    Style::new().fg(Color::Yellow),
                ));
            }
            spans.push(Span::raw(")"));
            out.push(Line::from(spans));
        }
        for p in &live {
            let bytes: Vec<String> = p.bytes.iter().map(|&b| mib(b)).collect();
            let mark = match p.enforced {
                Some(true) => Span::styled("enforced", Style::new().fg(Color::Green)),
                Some(false) => Span::styled("NOT ENFORCED", Style::new().fg(Color::Red)),
                None => Span::raw(""),
            };
            out.push(Line::from(vec![
                Span::raw(format!(
                    "    pid {:>7} {:<16} {:<10} {:<12} ",
                    p.pid,
                    p.name,
                    p.state,
                    bytes.join(" ")
                )),
                mark,
            ]));
        }
        if s.attach_failures > 0 {
            out.push(Line::from(Span::styled(
                format!(
                    "    {} process(es) could not join the ledger",
                    s.attach_failures
                ),
                Style::new().fg(Color::Red),
            )));
        }
    }
}

/// A line's text, without its styles (`--once`).
fn plain(line: &Line) -> String {
    line.spans.iter().map(|s| s.content.as_ref()).collect()
}
