//! Acting as a ServiceAccount: tokens minted with TokenRequest and a
//! kubeconfig holding nothing but such a token, for kubectl and for kube.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

/// A token minted (TokenRequest, one hour) for the ServiceAccount `account`
/// in `namespace`.
pub(crate) async fn mint_token(client: &Client, namespace: &str, account: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let minted: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .expect("TokenRequest for the ServiceAccount");
    minted.status.expect("a token").token
}

/// The API server's URL and CA (PEM) from the admin kubeconfig's current context.
pub(crate) fn admin_cluster() -> (String, Vec<u8>) {
    let admin = kube::config::Kubeconfig::read().expect("read KUBECONFIG");
    let context = admin
        .contexts
        .iter()
        .find(|c| Some(&c.name) == admin.current_context.as_ref())
        .and_then(|c| c.context.clone())
        .expect("a current context");
    let cluster = admin
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .expect("the context's cluster");
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => base64_decode(data),
        (None, Some(file)) => std::fs::read(file).expect("read the CA file"),
        (None, None) => panic!("the cluster in KUBECONFIG has no CA"),
    };
    (cluster.server.expect("a server URL"), ca)
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        let value = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// A kubeconfig holding only the API server's address, its CA and a token
/// minted for a ServiceAccount.
pub struct TokenKubeconfig {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TokenKubeconfig {
    /// Mints a token for `account` in `namespace` and writes the kubeconfig.
    pub async fn mint(client: &Client, namespace: &str, account: &str) -> Self {
        let token = mint_token(client, namespace, account).await;
        let (server, ca) = admin_cluster();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, ca).unwrap();
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "cluster", "cluster": {
                "server": server,
                "certificate-authority": ca_file.display().to_string(),
            }}],
            "users": [{ "name": account, "user": { "token": token } }],
            "contexts": [{ "name": "token", "context": { "cluster": "cluster", "user": account } }],
            "current-context": "token",
        });
        let path = dir.path().join("kubeconfig");
        // JSON is YAML: kubectl and kube read it as is.
        std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig).unwrap()).unwrap();
        Self { _dir: dir, path }
    }

    /// The kubeconfig file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A kube client that authenticates with the token alone.
    pub async fn client(&self) -> Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.path).expect("the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client config from the kubeconfig");
        Client::try_from(config).expect("a client")
    }

    /// `kubectl auth can-i <args>` with the token: true for "yes".
    pub fn can_i(&self, args: &[&str]) -> bool {
        let kubeconfig = self.path.display().to_string();
        let mut argv = vec!["--kubeconfig", &kubeconfig, "auth", "can-i"];
        argv.extend_from_slice(args);
        let (_, out, err) = super::kubectl(&argv);
        match out.trim() {
            "yes" => true,
            "no" => false,
            other => panic!("kubectl auth can-i {args:?}: {other:?} {err}"),
        }
    }
}
