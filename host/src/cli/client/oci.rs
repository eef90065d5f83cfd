//! `host deploy oci://…` and `host push`: a WebAssembly component as an
//! OCI artifact, in the layout `wkg`, wasmCloud and Spin use (one
//! `application/wasm` layer, a `application/vnd.wasm.config.v0+json`
//! config), pulled and pushed with the oci-client crate. Credentials come
//! from flags or the Docker config file; TLS trusts the system's roots or
//! the `--registry-ca-file` given. What is pulled is checked against the
//! digests its manifest and reference name before anything is deployed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, Config, ImageLayer};
use oci_client::errors::{DigestError, OciDistributionError, OciEnvelope, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use taskhost::runtime::{Digest, MAX_PLUGIN_BYTES};

use super::super::exit::{EXIT_DAEMON, EXIT_USAGE, ExitError, usage};

/// What names a registry's artifact on the command line.
pub const SCHEME: &str = "oci://";

/// The layer media type of a component (`wkg`, wasmCloud, Spin).
const WASM_LAYER: &str = "application/wasm";
/// The config media type of the same layout.
const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of older tools (wasm-to-oci), accepted on pulls.
const WASM_LAYER_OLD: &str = oci_client::manifest::WASM_LAYER_MEDIA_TYPE;

/// How long to wait for a registry to accept a connection, and between
/// two reads of its answer.
const PATIENCE: Duration = Duration::from_secs(30);

/// How a registry is reached.
#[derive(Debug, Args, Default)]
pub struct RegistryArgs {
    /// The registry's user name, with --registry-password-stdin [default: the Docker config file's credentials for the registry ($DOCKER_CONFIG/config.json, else ~/.docker/config.json), else none].
    #[arg(long, value_name = "USER", requires = "registry_password_stdin")]
    registry_user: Option<String>,
    /// Read the registry's password (or token) for --registry-user from standard input.
    #[arg(long, requires = "registry_user")]
    registry_password_stdin: bool,
    /// PEM certificates of the CA that signed the registry's certificate, trusted besides the system's roots.
    #[arg(long, value_name = "PEM")]
    registry_ca_file: Option<PathBuf>,
}

/// An `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]` argument, if
/// `text` is one.
pub fn reference(text: &str) -> Option<anyhow::Result<Reference>> {
    let rest = text.strip_prefix(SCHEME)?;
    Some(rest.parse::<Reference>().map_err(|e| {
        usage(format!(
            "`{text}` is not a registry reference ({e}): give oci://REGISTRY/REPOSITORY:TAG \
             or oci://REGISTRY/REPOSITORY@sha256:DIGEST"
        ))
    }))
}

/// A client and credentials for `reference`'s registry.
fn connect(args: &RegistryArgs, reference: &Reference) -> anyhow::Result<(Client, RegistryAuth)> {
    // (reqwest's rustls takes the provider `cli::main` installed.)
    let mut config = ClientConfig {
        connect_timeout: Some(PATIENCE),
        read_timeout: Some(PATIENCE),
        ..ClientConfig::default()
    };
    if let Some(path) = &args.registry_ca_file {
        let data = std::fs::read(path).map_err(|e| {
            usage(format!(
                "cannot read --registry-ca-file `{}`: {e}",
                path.display()
            ))
        })?;
        config.extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    let client = Client::try_from(config)
        .map_err(|e| usage(format!("cannot set up the registry client: {e}")))?;
    let registry = reference.resolve_registry();
    let auth = match &args.registry_user {
        Some(user) => {
            let mut password = String::new();
            std::io::stdin()
                .read_to_string(&mut password)
                .map_err(|e| usage(format!("cannot read the password from stdin: {e}")))?;
            RegistryAuth::Basic(user.clone(), password.trim_end_matches(['\r', '\n']).into())
        }
        None => docker_config_auth(registry)?,
    };
    Ok((client, auth))
}

/// The Docker config file's credentials for `registry`, if it has some.
fn docker_config_auth(registry: &str) -> anyhow::Result<RegistryAuth> {
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => match std::env::var_os("HOME") {
            Some(home) => Path::new(&home).join(".docker/config.json"),
            None => return Ok(RegistryAuth::Anonymous),
        },
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RegistryAuth::Anonymous),
        Err(e) => return Err(usage(format!("cannot read `{}`: {e}", path.display()))),
    };
    let bad = |why: &str| usage(format!("`{}` {why}", path.display()));
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(&format!("is not JSON: {e}")))?;
    let auths = config.get("auths").and_then(|a| a.as_object());
    let entry = auths.and_then(|auths| {
        auths.iter().find_map(|(key, value)| {
            let host = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .split('/')
                .next()
                .unwrap_or_default();
            (host == registry).then_some(value)
        })
    });
    let Some(entry) = entry else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let Some(encoded) = entry.get("auth").and_then(|a| a.as_str()) {
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .ok_or_else(|| bad(&format!("has an `auth` for {registry} that is not base64")))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| bad(&format!("has an `auth` for {registry} without a `:`")))?;
        return Ok(RegistryAuth::Basic(user.into(), password.into()));
    }
    let field = |name: &str| entry.get(name).and_then(|v| v.as_str());
    match (field("username"), field("password")) {
        (Some(user), Some(password)) => Ok(RegistryAuth::Basic(user.into(), password.into())),
        _ => Ok(RegistryAuth::Anonymous),
    }
}

/// A registry's error as the CLI's: what was asked, what went wrong (with
/// its causes), and the fix.
fn failed(doing: &str, shown: &str, err: OciDistributionError) -> anyhow::Error {
    let mut why = err.to_string().trim_end().to_owned();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        why.push_str(": ");
        why.push_str(&cause.to_string());
        source = cause.source();
    }
    let unknown = |envelope: &OciEnvelope| {
        envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::NotFound
                    | OciErrorCode::BlobUnknown
            )
        })
    };
    let (code, fix) = match &err {
        OciDistributionError::ImageManifestNotFoundError(_) => {
            (EXIT_USAGE, "check the repository, tag and digest")
        }
        OciDistributionError::RegistryError { envelope, .. } if unknown(envelope) => {
            (EXIT_USAGE, "check the repository, tag and digest")
        }
        OciDistributionError::ServerError { code: 404, .. } => {
            (EXIT_USAGE, "check the repository, tag and digest")
        }
        OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::ServerError {
            code: 401 | 403, ..
        }
        | OciDistributionError::UnauthorizedError { .. } => (
            EXIT_DAEMON,
            "give --registry-user with --registry-password-stdin, or log in with `docker login`",
        ),
        OciDistributionError::RequestError(_) => (
            EXIT_DAEMON,
            "check that the registry runs at that address (and --registry-ca-file for a private CA)",
        ),
        _ => (EXIT_DAEMON, "check the reference and the registry"),
    };
    ExitError::error(code, format!("cannot {doing} {shown}: {why}; {fix}"))
}

/// The component at `reference`, checked against the digests its
/// manifest and reference name; nothing is kept unless all of it came.
pub async fn pull(args: &RegistryArgs, reference: &Reference) -> anyhow::Result<Vec<u8>> {
    let shown = format!("{SCHEME}{}", reference.whole());
    let (client, auth) = connect(args, reference)?;
    let (manifest, digest) = client
        .pull_image_manifest(reference, &auth)
        .await
        .map_err(|e| failed("pull", &shown, e))?;
    if let Some(wanted) = reference.digest()
        && wanted != digest
    {
        return Err(ExitError::error(
            EXIT_DAEMON,
            format!("{shown}: the registry sent manifest {digest}, not {wanted}; nothing deployed"),
        ));
    }
    let layers: Vec<_> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER || l.media_type == WASM_LAYER_OLD)
        .collect();
    let [layer] = layers[..] else {
        let types: Vec<_> = manifest
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect();
        return Err(usage(format!(
            "{shown} is not a WebAssembly component artifact: it needs one `{WASM_LAYER}` layer, \
             and its layers are {types:?}"
        )));
    };
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > MAX_PLUGIN_BYTES as u64 {
        return Err(usage(format!(
            "{shown} is {size} bytes, over the {} MiB a plugin may have",
            MAX_PLUGIN_BYTES >> 20
        )));
    }
    let mut stream = client
        .pull_blob_stream(reference, layer)
        .await
        .map_err(|e| failed("pull", &shown, e))?;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    while let Some(chunk) = stream.stream.next().await {
        let chunk = chunk.map_err(|e| match e.get_ref().and_then(|i| i.downcast_ref::<DigestError>()) {
            Some(mismatch) => ExitError::error(
                EXIT_DAEMON,
                format!(
                    "{shown}: the layer's bytes are not the ones the manifest names ({mismatch}); \
                     nothing deployed"
                ),
            ),
            None => failed("pull", &shown, e.into()),
        })?;
        if (bytes.len() + chunk.len()) as u64 > size {
            return Err(ExitError::error(
                EXIT_DAEMON,
                format!("{shown}: the registry sent more than the layer's {size} bytes"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    let found = format!("sha256:{}", Digest::of(&bytes).hex());
    if found != layer.digest {
        return Err(ExitError::error(
            EXIT_DAEMON,
            format!(
                "{shown}: the layer's bytes are not the ones the manifest names (digest {found}, \
                 not {}); nothing deployed",
                layer.digest
            ),
        ));
    }
    Ok(bytes)
}

/// Publishes `bytes` at `reference`; returns the manifest's digest.
pub async fn push(
    args: &RegistryArgs,
    reference: &Reference,
    bytes: Vec<u8>,
) -> anyhow::Result<String> {
    let shown = format!("{SCHEME}{}", reference.whole());
    if reference.digest().is_some() {
        return Err(usage(format!(
            "{shown} names a digest: push to a tag (oci://REGISTRY/REPOSITORY:TAG); the \
             registry gives the digest"
        )));
    }
    let (client, auth) = connect(args, reference)?;
    let layer = ImageLayer::new(bytes, WASM_LAYER.to_owned(), None);
    let created = jiff::Timestamp::now().to_string();
    let config = serde_json::json!({
        "created": created,
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer.sha256_digest()],
    });
    let config = Config::new(
        serde_json::to_vec(&config).expect("a JSON value serializes"),
        WASM_CONFIG.to_owned(),
        None,
    );
    client
        .push(reference, &[layer], config, &auth, None)
        .await
        .map_err(|e| failed("push to", &shown, e))?;
    client
        .fetch_manifest_digest(reference, &auth)
        .await
        .map_err(|e| failed("read back", &shown, e))
}
