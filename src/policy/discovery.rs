//! Which `flowcontrol.apiserver.k8s.io` version the protected cluster serves: read from the API
//! group's discovery document (`GET /apis/flowcontrol.apiserver.k8s.io`, an `APIGroup`), as a
//! client-go discovery client does (`discovery_client.go`: `ServerGroups`, whose
//! `PreferredVersion` a RESTMapper takes first). Clusters before 1.29 serve only the betas
//! (`v1beta3` from 1.26, `v1beta2` from 1.23, `v1beta1` before), so a gateway that always reads
//! `v1` reads nothing there.
//!
//! The choice: the group's preferred version when it is one we understand and served, else the
//! newest served version we understand (`v1`, `v1beta3`, `v1beta2`, `v1beta1`), else an error.

use super::error::ResponseError;
use super::objects::ApiVersion;
use serde_json::Value;

/// The API group of the flowcontrol objects.
pub const GROUP: &str = "flowcontrol.apiserver.k8s.io";
/// The group's discovery document.
pub const DISCOVERY_PATH: &str = "/apis/flowcontrol.apiserver.k8s.io";
/// The version read when discovery has not answered yet (or never does): the newest.
pub const FALLBACK: ApiVersion = ApiVersion::V1;
/// The discovery document is read again after this many policy reads, so a cluster upgrade that
/// changes the served version is followed (a list answering 404 triggers it earlier).
pub const REDISCOVER_EVERY: u32 = 10;

/// The version `<version>` of `flowcontrol.apiserver.k8s.io/<version>` (`v1`, …).
pub fn version_name(v: ApiVersion) -> &'static str {
    v.api_version().rsplit('/').next().unwrap_or("v1")
}

/// `/apis/flowcontrol.apiserver.k8s.io/<version>`.
pub fn path_prefix(v: ApiVersion) -> String {
    format!("{DISCOVERY_PATH}/{}", version_name(v))
}

/// What a discovery document says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The version to read.
    pub version: ApiVersion,
    /// Every version the group serves, as listed (also ones we do not understand).
    pub served: Vec<String>,
    /// The group's preferred version, if it names one.
    pub preferred: Option<String>,
}

/// The version of one `GroupVersionForDiscovery` (`{"groupVersion": "g/v", "version": "v"}`):
/// `version`, else the part of `groupVersion` after the group.
fn entry_version(e: &Value) -> Option<String> {
    let v = e.get("version").and_then(Value::as_str).filter(|v| !v.is_empty());
    let from_gv = || e.get("groupVersion")?.as_str()?.strip_prefix(GROUP)?.strip_prefix('/').map(str::to_string);
    v.map(str::to_string).or_else(from_gv)
}

fn understood(version: &str) -> Option<ApiVersion> {
    ApiVersion::parse(&format!("{GROUP}/{version}"))
}

/// Reads the `APIGroup` discovery document `body` and picks the version to read (see the module
/// documentation). An error says why the document is unusable.
pub fn choose_version(body: &[u8]) -> Result<Discovered, ResponseError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| ResponseError::discovery(format!("discovery document: {e}")))?;
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "APIGroup" {
        return Err(ResponseError::discovery(format!("discovery document: kind {kind:?}, expected \"APIGroup\"")));
    }
    let name = doc.get("name").and_then(Value::as_str).unwrap_or("");
    if name != GROUP {
        return Err(ResponseError::discovery(format!("discovery document: group {name:?}, expected {GROUP:?}")));
    }
    let versions =
        doc.get("versions").and_then(Value::as_array).ok_or_else(|| ResponseError::discovery("discovery document: no versions"))?;
    let served: Vec<String> = versions.iter().filter_map(entry_version).collect();
    let preferred = doc.get("preferredVersion").and_then(entry_version);
    let pick_preferred = preferred.as_deref().filter(|p| served.iter().any(|s| s == p)).and_then(understood);
    let newest = served.iter().filter_map(|s| understood(s)).min();
    match pick_preferred.or(newest) {
        Some(version) => Ok(Discovered { version, served, preferred }),
        None => Err(ResponseError::discovery(format!(
            "the cluster serves {GROUP} versions {served:?}, none of which this gateway understands (v1, v1beta3, v1beta2, v1beta1)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(versions: &[&str], preferred: Option<&str>) -> Vec<u8> {
        let gv = |v: &str| serde_json::json!({"groupVersion": format!("{GROUP}/{v}"), "version": v});
        let mut d = serde_json::json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
                                        "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>()});
        if let Some(p) = preferred {
            d["preferredVersion"] = gv(p);
        }
        serde_json::to_vec(&d).unwrap()
    }

    #[test]
    fn prefers_the_preferred_version_then_the_newest_understood() {
        let pick = |vs: &[&str], p: Option<&str>| choose_version(&doc(vs, p)).map(|d| d.version);
        assert_eq!(pick(&["v1", "v1beta3"], Some("v1")), Ok(ApiVersion::V1));
        assert_eq!(pick(&["v1beta3", "v1beta2"], Some("v1beta2")), Ok(ApiVersion::V1beta2));
        assert_eq!(pick(&["v1beta2", "v1beta1"], None), Ok(ApiVersion::V1beta2));
        assert_eq!(pick(&["v2alpha1", "v1beta3"], Some("v2alpha1")), Ok(ApiVersion::V1beta3));
        // A preferred version that is not served is not taken.
        assert_eq!(pick(&["v1beta1"], Some("v1")), Ok(ApiVersion::V1beta1));
        assert!(pick(&["v2alpha1"], Some("v2alpha1")).unwrap_err().to_string().contains("none of which"));
        assert_eq!(path_prefix(ApiVersion::V1beta2), "/apis/flowcontrol.apiserver.k8s.io/v1beta2");
    }

    #[test]
    fn reads_the_version_from_group_version_alone() {
        let body = br#"{"kind":"APIGroup","name":"flowcontrol.apiserver.k8s.io",
            "versions":[{"groupVersion":"flowcontrol.apiserver.k8s.io/v1beta3"}],
            "preferredVersion":{"groupVersion":"flowcontrol.apiserver.k8s.io/v1beta3"}}"#;
        assert_eq!(choose_version(body).unwrap().version, ApiVersion::V1beta3);
    }

    #[test]
    fn refuses_malformed_documents() {
        for (body, why) in [
            (&b"not json"[..], "discovery document:"),
            (br#"{"kind":"Status","code":404}"#, "kind \"Status\""),
            (br#"{"kind":"APIGroup","name":"apps"}"#, "group \"apps\""),
            (br#"{"kind":"APIGroup","name":"flowcontrol.apiserver.k8s.io"}"#, "no versions"),
            (br#"{"kind":"APIGroup","name":"flowcontrol.apiserver.k8s.io","versions":[]}"#, "none of which"),
        ] {
            let e = choose_version(body).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
    }
}
