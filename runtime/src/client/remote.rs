//! One job on the pool: place it, upload the module only where it is
//! missing, and fall through to the next candidate when a worker refuses
//! or cannot be reached.

use reqwest::StatusCode;

use super::{fetch_peers, placement};
use crate::proto::{JobResult, JobSpec, LARGEST_JOB_HEADER, POSTCARD};

/// Runs `spec` (whose module is `module_bytes`) on the best peer of the
/// pool reached through `peers`.
pub async fn run(http: &reqwest::Client, peers: &[String], module_bytes: &[u8], spec: &JobSpec) -> anyhow::Result<JobResult> {
    if !spec.dirs.is_empty() {
        anyhow::bail!(
            "--dir cannot be used with a remote worker yet: its files would not come back; \
             run without --peers to use the embedded worker"
        );
    }
    let view = fetch_peers(http, peers).await?;
    let candidates = placement::candidates(&view, spec.limits.memory_bytes).map_err(anyhow::Error::msg)?;
    let body = postcard::to_allocvec(spec)?;
    let mut refusals = Vec::new();
    for addr in &candidates {
        match submit(http, addr, &body, module_bytes, spec).await {
            Ok(result) => return Ok(result),
            Err(why) => {
                tracing::debug!(peer = %addr, "not run there: {why}");
                refusals.push(format!("{addr}: {why}"));
            }
        }
    }
    anyhow::bail!("no peer took the job ({})", refusals.join("; "))
}

/// Submits to one worker, uploading the module once if it lacks it.
async fn submit(
    http: &reqwest::Client,
    addr: &str,
    body: &[u8],
    module_bytes: &[u8],
    spec: &JobSpec,
) -> Result<JobResult, String> {
    for attempt in 0..2 {
        let resp = http
            .post(format!("http://{addr}/v1/jobs"))
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match resp.status() {
            StatusCode::OK => {
                let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
                return postcard::from_bytes(&bytes).map_err(|e| format!("unreadable result: {e}"));
            }
            StatusCode::NOT_FOUND if attempt == 0 => upload(http, addr, module_bytes, spec).await?,
            StatusCode::UNPROCESSABLE_ENTITY => {
                let largest = resp.headers().get(LARGEST_JOB_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
                return Err(format!("too large here (largest {})", largest.unwrap_or_default()));
            }
            status => {
                let message = resp.text().await.unwrap_or_default();
                return Err(format!("{status}: {}", message.trim()));
            }
        }
    }
    Err("the module was uploaded but the worker still did not know it".into())
}

async fn upload(http: &reqwest::Client, addr: &str, module_bytes: &[u8], spec: &JobSpec) -> Result<(), String> {
    let resp = http
        .put(format!("http://{addr}/v1/modules/{}", spec.module.to_hex()))
        .header(reqwest::header::CONTENT_TYPE, "application/wasm")
        .body(module_bytes.to_vec())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("module upload refused: {} {}", resp.status(), resp.text().await.unwrap_or_default().trim()))
    }
}
