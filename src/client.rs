//! A small HTTP client of `codecage serve`, over its unix socket or TCP, for the CLI's
//! `session` commands (and later `codecage mcp` run by a non-root user).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;

use crate::server::config::DEFAULT_SOCKET;

/// Where the server is: `unix:PATH` or `http://HOST:PORT`.
#[derive(Debug, Clone)]
pub enum Server {
    Unix(String),
    Tcp { authority: String },
}

impl Server {
    /// `--server`, else `$CODECAGE_SERVER`, else the default socket.
    pub fn choose(flag: Option<&str>) -> Result<Server, String> {
        let text = flag
            .map(str::to_string)
            .or_else(|| std::env::var("CODECAGE_SERVER").ok())
            .unwrap_or_else(|| format!("unix:{DEFAULT_SOCKET}"));
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(Server::Unix(path.to_string()));
        }
        if let Some(rest) = text.strip_prefix("http://") {
            return Ok(Server::Tcp {
                authority: rest.trim_end_matches('/').to_string(),
            });
        }
        Err(format!(
            "{text:?} is not a server: use unix:PATH or http://HOST:PORT"
        ))
    }
}

/// One answer: status and body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What a request carries.
pub enum Body {
    None,
    Json(serde_json::Value),
    /// Raw bytes (a file upload), sent as application/octet-stream.
    Bytes(Vec<u8>),
}

/// Sends one request and reads the whole answer. `token` goes in `Authorization: Bearer`.
pub async fn request(
    server: &Server,
    method: &str,
    path: &str,
    body: Body,
    token: Option<&str>,
) -> Result<Answer, String> {
    let unreachable = |e: &dyn std::fmt::Display| {
        let at = match server {
            Server::Unix(path) => format!("unix:{path}"),
            Server::Tcp { authority } => format!("http://{authority}"),
        };
        format!(
            "no codecage server answers at {at} ({e}): start one with `codecage serve` (as root), or give \
             --server / $CODECAGE_SERVER"
        )
    };
    let (content_type, bytes) = match body {
        Body::None => ("application/json", Vec::new()),
        Body::Json(value) => ("application/json", value.to_string().into_bytes()),
        Body::Bytes(bytes) => ("application/octet-stream", bytes),
    };
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "codecage")
        .header(hyper::header::CONTENT_TYPE, content_type);
    if let Some(token) = token {
        builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if let Some(route) = route_of(method, path) {
        builder = builder.header(crate::service::cluster::DEFAULT_ROUTE_HEADER, route);
    }
    let request = builder
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let response = match server {
        Server::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| unreachable(&e))?;
            send(stream, request).await?
        }
        Server::Tcp { authority } => {
            crate::cli::full::name_service("a server's address")?;
            let stream = tokio::net::TcpStream::connect(authority)
                .await
                .map_err(|e| unreachable(&e))?;
            send(stream, request).await?
        }
    };
    Ok(response)
}

async fn send<S>(stream: S, request: Request<Full<Bytes>>) -> Result<Answer, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with the server failed: {e}"))?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the server did not answer: {e}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the server's answer failed: {e}"))?
        .to_bytes()
        .to_vec();
    Ok(Answer { status, body })
}

/// The route a request carries for a cluster's router (deploy/kubernetes/README.md): a
/// fresh one for a new session, the id's first field for a session of the
/// `ROUTE.NODE.LOCAL` form; none for anything else (a one-shot run, a local id).
fn route_of(method: &str, path: &str) -> Option<String> {
    use crate::service::cluster;
    let path = path.split('?').next().unwrap_or(path);
    if method == "POST" && path == "/v1/sessions" {
        return cluster::new_route().ok();
    }
    let id = path.strip_prefix("/v1/sessions/")?.split('/').next()?;
    cluster::parse(id).map(|(route, _, _)| route.to_string())
}
