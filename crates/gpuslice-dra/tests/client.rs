//! The API client (kube-rs) against the FakeApiServer test double: the
//! credentials it shows (`--token-file`, an inferred kubeconfig, the
//! in-cluster service account), what a refused token and a bad
//! `--api-server` look like.
//!
//! kube-rs infers its configuration from the process's environment
//! (`KUBECONFIG`, `HOME`, `KUBERNETES_SERVICE_HOST`), which every test of
//! this binary shares: the tests of inference run again in a child process
//! given that environment (`gpuslice_testkit::process::this_test_again`),
//! and none sets it here.

use gpuslice_dra::apiserver::{ApiError, ApiTarget, ClaimSource, KubeApi, SliceApi};
use gpuslice_testkit::fakeapi::{shared_claim, FakeApiServer};
use gpuslice_testkit::process::{passed_again, test_name, this_test_again};

const TOKEN: &str = "eyJhbGciOi.the-driver.sa-token";

fn claim(fake: &FakeApiServer) {
    fake.put_claim(shared_claim("ns", "c", "uid-1", "node-a", 0, "20Gi", "30"));
}

#[tokio::test]
async fn the_token_file_is_sent_as_a_bearer_token_and_without_it_the_server_refuses() {
    let fake = FakeApiServer::start().await;
    claim(&fake);
    fake.require_token(Some(TOKEN));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    // A token file as the kubelet projects it: no trailing newline.
    std::fs::write(&token, TOKEN).unwrap();

    let api = KubeApi::new(&fake.url, Some(&token)).unwrap();
    let c = api.get_claim("ns", "c").await.unwrap();
    assert_eq!(c.metadata.uid.as_deref(), Some("uid-1"));
    api.list_slices("node-a", gpuslice_dra::DRIVER_NAME)
        .await
        .unwrap();
    let seen = fake.authorizations();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter()
            .all(|a| a.as_deref() == Some(&format!("Bearer {TOKEN}"))),
        "{seen:?}"
    );

    // No token, and a wrong one: 401, an error naming the URL and status.
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "not-the-token").unwrap();
    for api in [
        KubeApi::new(&fake.url, None).unwrap(),
        KubeApi::new(&fake.url, Some(&bad)).unwrap(),
    ] {
        let e = api.get_claim("ns", "c").await.unwrap_err();
        assert!(matches!(e, ApiError::Status { status: 401, .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains(&fake.url) && e.contains("resourceclaims/c") && e.contains("HTTP 401"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = api
            .list_slices("node-a", gpuslice_dra::DRIVER_NAME)
            .await
            .unwrap_err();
        assert!(matches!(e, ApiError::Status { status: 401, .. }), "{e:?}");
    }
    let seen = fake.authorizations();
    assert_eq!(seen[2], None, "no token, no header: {seen:?}");
    assert_eq!(seen[4].as_deref(), Some("Bearer not-the-token"));
}

#[tokio::test]
async fn a_bad_api_server_or_token_file_is_a_one_line_error_before_any_request() {
    for url in [
        "127.0.0.1:8001",
        "ftp://h",
        "https://",
        "https://u:p@h",
        "http://h?x",
    ] {
        let e = KubeApi::new(url, None).unwrap_err();
        assert!(matches!(e, ApiError::Url(_)), "{url}: {e:?}");
        let e = e.to_string();
        assert!(
            e.contains(&format!("{url:?}")) && e.contains("expected http(s)://HOST[:PORT]"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    let e = ApiTarget::new(None, Some("/nonexistent/token".as_ref()))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--token-file /nonexistent/token: "), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[tokio::test]
async fn nobody_listening_is_a_transport_error_naming_the_url() {
    // Port 9 (discard): nothing listens there on a test host.
    let api = KubeApi::new("http://127.0.0.1:9", None).unwrap();
    let e = api.get_claim("ns", "c").await.unwrap_err();
    assert!(matches!(e, ApiError::Transport { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.starts_with(
            "http://127.0.0.1:9/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c: "
        ),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// Marks the re-runs of [`the_kubeconfig_is_inferred_and_its_absence_is_one_line`]
/// given its environment: `present` (a kubeconfig; the other token file
/// named by [`OTHER_TOKEN_FILE`]) or `absent`.
const KUBECONFIG_CHILD: &str = "GPUSLICE_TEST_KUBECONFIG_CHILD";
const OTHER_TOKEN_FILE: &str = "GPUSLICE_TEST_OTHER_TOKEN_FILE";

#[tokio::test]
async fn the_kubeconfig_is_inferred_and_its_absence_is_one_line() {
    const TEST: &str = "the_kubeconfig_is_inferred_and_its_absence_is_one_line";
    match std::env::var(KUBECONFIG_CHILD).as_deref() {
        Ok("present") => return kubeconfig_present().await,
        Ok("absent") => return kubeconfig_absent().await,
        _ => {}
    }
    let fake = FakeApiServer::start().await;
    claim(&fake);
    fake.require_token(Some(TOKEN));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters:\n- name: double\n  cluster:\n    server: {}\n\
             users:\n- name: driver\n  user:\n    token: {TOKEN}\n\
             contexts:\n- name: test\n  context:\n    cluster: double\n    user: driver\n",
            fake.url
        ),
    )
    .unwrap();
    let other = dir.path().join("other");
    std::fs::write(&other, "rotated").unwrap();
    // The child's requests reach the double served by this test's runtime:
    // it is awaited off that runtime's thread.
    let rerun = |child: &'static str, kubeconfig: std::path::PathBuf| {
        let mut c = this_test_again(&test_name(module_path!(), TEST));
        c.env(KUBECONFIG_CHILD, child)
            .env(OTHER_TOKEN_FILE, &other)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST");
        tokio::task::spawn_blocking(move || passed_again(&mut c))
    };
    rerun("present", kubeconfig).await.unwrap();
    // The kubeconfig's token, then --token-file's in its place.
    let seen = fake.authorizations();
    assert!(
        seen.ends_with(&[
            Some(format!("Bearer {TOKEN}")),
            Some("Bearer rotated".to_string())
        ]),
        "{seen:?}"
    );
    // Neither a kubeconfig nor a service account: one line saying so.
    rerun("absent", dir.path().join("missing")).await.unwrap();
}

/// In the child given a kubeconfig: it is used, and `--token-file`
/// replaces its credentials.
async fn kubeconfig_present() {
    let api = ApiTarget::new(None, None).unwrap().connect().await.unwrap();
    let c = api.get_claim("ns", "c").await.unwrap();
    assert_eq!(c.metadata.name.as_deref(), Some("c"));
    let other = std::env::var_os(OTHER_TOKEN_FILE).unwrap();
    let api = ApiTarget::new(None, Some(other.as_ref()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let e = api.get_claim("ns", "c").await.unwrap_err();
    assert!(matches!(e, ApiError::Status { status: 401, .. }), "{e:?}");
}

/// In the child with neither a kubeconfig nor a service account.
async fn kubeconfig_absent() {
    let e = ApiTarget::new(None, None)
        .unwrap()
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(e, ApiError::Config(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("no kubeconfig") && e.contains("KUBERNETES_SERVICE_HOST"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// Marks the re-run of [`in_cluster_the_service_account_is_used_over_tls`]
/// inside its mount namespace.
const IN_CLUSTER_CHILD: &str = "GPUSLICE_TEST_IN_CLUSTER_CHILD";

/// A self-signed CA (test fixture only: the handshake is never finished,
/// so no key goes with it).
const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBjTCCATOgAwIBAgIULZYYotk+KqyP+LEpGhdL5PWBTSUwCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQZ3B1c2xpY2UtdGVzdC1jYTAgFw0yNjEyMDMyMTA0MjdaGA8y
MTI2MTEwOTIxMDQyN1owGzEZMBcGA1UEAwwQZ3B1c2xpY2UtdGVzdC1jYTBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABLdyGmrGrnQZthIG0uFMfxACZvmJYaAT8iYt
eqQEMqB3Lnt9sWc//Jpsso6OSsKNB5us6LVRCv5oXVNbTiJwsEOjUzBRMB0GA1Ud
DgQWBBT1srs4bgC+qIufvLUaxUPJdrRoujAfBgNVHSMEGDAWgBT1srs4bgC+qIuf
vLUaxUPJdrRoujAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQD1
D66FmBM1YQnEh3mpPOymwMmUh7lB0kP1Haxi6y4/4QIgFtZwincU+qfeyS+efxSP
bQbFlhH+PW2Tke+XgwBIshk=
-----END CERTIFICATE-----
";

/// In a pod (no kubeconfig): the service account's files and
/// `KUBERNETES_SERVICE_HOST`/`_PORT` are picked up, and the API server is
/// spoken to over TLS. kube-rs reads the files at fixed paths
/// (`/var/run/secrets/kubernetes.io/serviceaccount/`), so the test runs
/// itself again in a private mount namespace with a tmpfs on /run holding
/// them; the host's /run is untouched. The "API server" is a TCP listener
/// here that sees the TLS ClientHello and hangs up.
#[test]
fn in_cluster_the_service_account_is_used_over_tls() {
    const TEST: &str = "in_cluster_the_service_account_is_used_over_tls";
    let test = test_name(module_path!(), TEST);
    if let Some(port) = std::env::var_os(IN_CLUSTER_CHILD) {
        return in_cluster_child(port.to_str().unwrap());
    }
    let unmet = gpuslice_testkit::needs_root()
        .or_else(|| gpuslice_testkit::needs_program("unshare", "util-linux"));
    if !gpuslice_testkit::precondition(TEST, unmet) {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let home = tempfile::tempdir().unwrap();
    let server = std::thread::spawn(move || {
        use std::io::Read;
        let (mut conn, _) = listener.accept().unwrap();
        let mut first = [0u8; 3];
        conn.read_exact(&mut first).unwrap();
        first
    });
    let script = r#"set -e
mount -t tmpfs gpuslice-test /run
d=/var/run/secrets/kubernetes.io/serviceaccount
mkdir -p $d
printf %s "$SA_TOKEN" > $d/token
printf %s "$SA_CA" > $d/ca.crt
printf %s ns > $d/namespace
exec "$0" --exact "$1" --nocapture --test-threads=1"#;
    passed_again(
        std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script])
            .arg(std::env::current_exe().unwrap())
            .arg(&test)
            .env(IN_CLUSTER_CHILD, &port)
            .env("SA_TOKEN", TOKEN)
            .env("SA_CA", TEST_CA)
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", &port)
            .env("KUBECONFIG", home.path().join("none"))
            .env("HOME", home.path()),
    );
    // A TLS handshake record (0x16), TLS 1.x (0x03 ..): not plain HTTP.
    let first = server.join().unwrap();
    assert_eq!(first[..2], [0x16, 0x03], "{first:?}");
    assert!(
        !std::path::Path::new("/var/run/secrets/kubernetes.io").exists(),
        "the host's /run is untouched"
    );
}

fn in_cluster_child(port: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api = ApiTarget::new(None, None).unwrap().connect().await.unwrap();
        let base = format!("https://127.0.0.1:{port}");
        assert!(format!("{api:?}").contains(&base), "{api:?}");
        // The listener hangs up in the handshake: a transport error naming
        // the in-cluster URL.
        let e = api.get_claim("ns", "c").await.unwrap_err();
        assert!(matches!(e, ApiError::Transport { .. }), "{e:?}");
        assert!(e.to_string().starts_with(&base), "{e}");
    });
}
