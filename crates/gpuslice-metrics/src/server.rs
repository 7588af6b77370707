//! The HTTP side: `/metrics`, `/healthz`. One tokio current-thread runtime
//! on its own thread; each request copies the last rendering and appends
//! the sample age, so it costs microseconds and never waits on collection.

use crate::sample::{render_age, to_classic};
use crate::Shared;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(respond(&req, &shared)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

/// The answer to one request.
pub fn respond<B>(req: &Request<B>, shared: &Shared) -> Response<Full<Bytes>> {
    let text = |code: StatusCode, body: String| {
        Response::builder()
            .status(code)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts")
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            let cur = shared.current();
            let age = render_age(cur.taken.elapsed().as_secs_f64());
            // OpenMetrics for those who ask (Prometheus does), else the
            // classic text format.
            let om = req
                .headers()
                .get_all(hyper::header::ACCEPT)
                .iter()
                .any(|v| {
                    v.to_str()
                        .is_ok_and(|v| v.contains("application/openmetrics-text"))
                });
            let (body, content_type) = if om {
                (cur.openmetrics.clone() + &age, OPENMETRICS)
            } else {
                (cur.classic.clone() + &to_classic(&age), CLASSIC)
            };
            Response::builder()
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)))
                .expect("static response parts")
        }
        "/healthz" => {
            let age = shared.current().taken.elapsed();
            let limit = (shared.interval * 3).max(Duration::from_secs(10));
            if age <= limit {
                text(StatusCode::OK, "ok\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("stale: last sample {:.1}s ago\n", age.as_secs_f64()),
                )
            }
        }
        "/" => text(
            StatusCode::OK,
            "gpuslice exporter: /metrics, /healthz\n".into(),
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}
