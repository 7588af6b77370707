//! `fakegpu-host --dir DIR [--gpus N] [--modify-device-files 0|1]
//! [--init-ms-per-gpu MS] [--ctx-ms MS] [--mig GPU:N]... [--degraded-link GPU]...`
//!
//! Builds a fake host at DIR (kept) for manual runs and prints the
//! environment that points programs at it, as `export` lines:
//!
//! ```sh
//! eval "$(fakegpu-host --gpus 8 --dir /tmp/fh)"
//! gpuslice --host-root "$FAKEGPU_ROOT" list
//! ```

use fakegpu::FakeHost;

const USAGE: &str = "usage: fakegpu-host --dir DIR [--gpus N] [--modify-device-files 0|1] \
[--init-ms-per-gpu MS] [--ctx-ms MS] [--mig GPU:N]... [--degraded-link GPU]...";

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: not a number: {v}"))
}

fn parse(args: &[String]) -> Result<fakegpu::FakeHostBuilder, String> {
    let mut builder = FakeHost::builder().gpus(8);
    let mut dir = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let v = it.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        builder = match flag.as_str() {
            "--dir" => {
                dir = Some(v.clone());
                builder
            }
            "--gpus" => builder.gpus(number(flag, v)?),
            "--modify-device-files" => builder.modify_device_files(v != "0"),
            "--init-ms-per-gpu" => builder.init_ms_per_gpu(number(flag, v)?),
            "--ctx-ms" => builder.ctx_ms(number(flag, v)?),
            "--degraded-link" => builder.degraded_link(number(flag, v)?),
            "--mig" => {
                let (gpu, n) = v
                    .split_once(':')
                    .ok_or(format!("--mig wants GPU:N, not {v}"))?;
                builder.mig(number(flag, gpu)?, number(flag, n)?)
            }
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        };
    }
    let dir = dir.ok_or(format!("--dir is required\n{USAGE}"))?;
    Ok(builder.root(dir))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let host = parse(&args).and_then(|b| b.build().map_err(|e| e.to_string()));
    match host {
        Ok(host) => {
            for (k, v) in host.env() {
                println!("export {k}='{v}'");
            }
            for gpu in host.gpus() {
                println!("# nvidia{} {} {}", gpu.minor, gpu.pci_bus_id, gpu.uuid);
            }
        }
        Err(e) => {
            eprintln!("fakegpu-host: {e}");
            std::process::exit(2);
        }
    }
}
