//! Session ids that carry their route and their node, for a server behind a router that
//! hashes a header (deploy/kubernetes/README.md, "Routing"): with `[cluster]` configured,
//! a session's id is `ROUTE.NODE.LOCAL`, where ROUTE is the 16 hex digits the client sent
//! in the route header when it created the session (and sends with every later call, so
//! the router's consistent hash brings them to this node), NODE this server's node and
//! LOCAL the 128 random bits of every id. A call for an id of another node means that
//! node is gone or the hash moved: `session_lost`, naming it, not `not_found`. Without
//! `[cluster]` ids are LOCAL alone, as on one machine.

use serde::Deserialize;

use super::{Error, Kind};

/// The header the router hashes, when the config does not name another.
pub const DEFAULT_ROUTE_HEADER: &str = "X-Codecage-Route";

/// `[cluster]`: `route_header` turns it on; `node` names this server's node (default:
/// `$CODECAGE_NODE`, which the DaemonSet sets from the pod's `spec.nodeName`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    pub route_header: Option<String>,
    pub node: Option<String>,
}

impl ClusterConfig {
    pub fn enabled(&self) -> bool {
        self.route_header.is_some()
    }

    /// This server's node: the config's, else `$CODECAGE_NODE`.
    pub fn node(&self) -> Option<String> {
        self.node
            .clone()
            .or_else(|| std::env::var("CODECAGE_NODE").ok())
            .filter(|n| !n.is_empty())
    }

    pub fn validate(&self) -> Result<(), String> {
        let Some(header) = &self.route_header else {
            if self.node.is_some() {
                return Err("cluster.node is set without cluster.route_header: give both (route_header = \"X-Codecage-Route\") or neither".into());
            }
            return Ok(());
        };
        if header.is_empty()
            || !header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "cluster.route_header = {header:?}: give an HTTP header name (letters, digits, - and _), e.g. {DEFAULT_ROUTE_HEADER:?}"
            ));
        }
        let node = self.node().ok_or(
            "cluster.route_header is set but the node is not: give cluster.node or set $CODECAGE_NODE (the DaemonSet sets it from spec.nodeName)",
        )?;
        if node.len() > 253
            || !node
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            || node.starts_with(['.', '-'])
            || node.ends_with(['.', '-'])
        {
            return Err(format!(
                "the cluster node {node:?} is not a Kubernetes node name: lowercase letters, digits, '-' and '.', at most 253, starting and ending with a letter or digit"
            ));
        }
        Ok(())
    }
}

/// A route: 16 lowercase hex digits.
pub fn is_route(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A fresh route (64 random bits), for a session made without one (MCP's).
pub fn new_route() -> Result<String, Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| {
        Error::new(
            Kind::Setup,
            format!("the system's random number generator failed ({e}); no route can be made"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The id of a new session whose own random part is `local`: `local` alone outside a
/// cluster, else `ROUTE.NODE.LOCAL` with the client's route (a fresh one without).
pub fn session_id(
    config: &ClusterConfig,
    route: Option<&str>,
    local: String,
) -> Result<String, Error> {
    if !config.enabled() {
        return Ok(local);
    }
    let header = config
        .route_header
        .as_deref()
        .unwrap_or(DEFAULT_ROUTE_HEADER);
    let route = match route {
        Some(r) if is_route(r) => r.to_string(),
        Some(r) => {
            return Err(Error::new(
                Kind::InvalidRequest,
                format!("the {header} header is {r:?}: give 16 lowercase hex digits, fresh for each new session"),
            ))
        }
        None => new_route()?,
    };
    let node = config.node().ok_or_else(|| {
        Error::new(
            Kind::Setup,
            "the cluster node is not known (cluster.node, $CODECAGE_NODE)",
        )
    })?;
    Ok(format!("{route}.{node}.{local}"))
}

/// `(route, node, local)` of an id of the `ROUTE.NODE.LOCAL` form.
pub fn parse(id: &str) -> Option<(&str, &str, &str)> {
    let (route, rest) = id.split_once('.')?;
    let (node, local) = rest.rsplit_once('.')?;
    let hex = |s: &str| s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (is_route(route) && !node.is_empty() && hex(local)).then_some((route, node, local))
}

/// For an id this server does not hold: `session_lost` when the id names another node (it
/// is gone, or the router's hash moved the route), else nothing (the caller answers
/// `not_found`).
pub fn lost_elsewhere(config: &ClusterConfig, id: &str) -> Option<Error> {
    if !config.enabled() {
        return None;
    }
    let (_, node, _) = parse(id)?;
    let me = config.node()?;
    (node != me).then(|| {
        Error::new(
            Kind::SessionLost,
            format!(
                "session {id} lives on node {node}, and this is node {me}: that node is gone or its route now reaches another node, and the session with it; create a new session"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(node: &str) -> ClusterConfig {
        ClusterConfig {
            route_header: Some(DEFAULT_ROUTE_HEADER.into()),
            node: Some(node.into()),
        }
    }

    #[test]
    fn ids_carry_the_route_and_the_node_and_parse_back() {
        let local = "0123456789abcdef0123456789abcdef".to_string();
        let config = on("ip-10-0-0-1.ec2.internal");
        let id = session_id(&config, Some("00ff00ff00ff00ff"), local.clone()).unwrap();
        assert_eq!(
            id,
            format!("00ff00ff00ff00ff.ip-10-0-0-1.ec2.internal.{local}")
        );
        assert_eq!(
            parse(&id),
            Some((
                "00ff00ff00ff00ff",
                "ip-10-0-0-1.ec2.internal",
                local.as_str()
            ))
        );
        let fresh = session_id(&config, None, local.clone()).unwrap();
        assert!(is_route(parse(&fresh).unwrap().0), "{fresh}");
        assert_eq!(
            session_id(&ClusterConfig::default(), Some("x"), local.clone()).unwrap(),
            local
        );
        let bad = session_id(&config, Some("ABC"), local).unwrap_err();
        assert_eq!(bad.kind, Kind::InvalidRequest);
        assert!(
            bad.message.contains("X-Codecage-Route") && bad.message.contains("16 lowercase hex"),
            "{}",
            bad.message
        );
    }

    #[test]
    fn another_nodes_id_is_lost_and_this_nodes_or_a_local_id_is_not() {
        let config = on("node-b");
        let local = "0123456789abcdef0123456789abcdef";
        let lost = lost_elsewhere(&config, &format!("00ff00ff00ff00ff.node-a.{local}")).unwrap();
        assert_eq!(lost.kind, Kind::SessionLost);
        assert!(
            lost.message.contains("node node-a") && lost.message.contains("node node-b"),
            "{}",
            lost.message
        );
        assert!(lost_elsewhere(&config, &format!("00ff00ff00ff00ff.node-b.{local}")).is_none());
        assert!(lost_elsewhere(&config, local).is_none());
        assert!(lost_elsewhere(
            &ClusterConfig::default(),
            &format!("00ff00ff00ff00ff.node-a.{local}")
        )
        .is_none());
    }

    #[test]
    fn the_config_names_what_is_missing_or_wrong() {
        assert!(ClusterConfig::default().validate().is_ok());
        assert!(on("node-a").validate().is_ok());
        let e = on("Node_A").validate().unwrap_err();
        assert!(e.contains("not a Kubernetes node name"), "{e}");
        let e = ClusterConfig {
            route_header: Some("X Route".into()),
            node: Some("a".into()),
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("cluster.route_header"), "{e}");
        let e = ClusterConfig {
            route_header: None,
            node: Some("a".into()),
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("without cluster.route_header"), "{e}");
    }
}
