//! Images by digest, and the runtime really in use.

use pretty_assertions::assert_eq;

use super::common::{IMAGE_ENV, Kind, Target, assert_error};

conformance! {
    fn a_digest_mismatch_is_refused_naming_both_digests(t: &Target) {
        let image = std::env::var(IMAGE_ENV).unwrap_or_else(|_| "airlock-test:bookworm@sha256:0".into());
        let (reference, real) = image.rsplit_once('@').unwrap();
        let wrong = format!("sha256:{}", "0".repeat(64));
        let policy = t.path().join("wrong-digest.toml");
        let store = super::common::native_image()
            .map(|(_, store)| format!("[images]\nstore = {store:?}\n"))
            .unwrap_or_default();
        std::fs::write(
            &policy,
            format!(
                "version = \"test-1\"\n[filesystem]\nrootfs = \"image:{reference}@{wrong}\"\n{}[docker]\ndocker_socket = {:?}\npodman_socket = {:?}\n{store}",
                t.kube_section(),
                super::common::docker_socket().display().to_string(),
                super::common::podman_socket().display().to_string()
            ),
        )
        .unwrap();
        let run = t.run_with(&policy, &["-c", "print('must not run')"]);
        if t.kind.is_native() {
            // The native backend finds images in its store by digest alone: a digest the
            // store lacks is refused by name, never run from another image or the host.
            assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
            let message = run.obs["error"]["message"].as_str().unwrap();
            assert!(message.contains(&wrong), "pinned digest missing: {message}");
            assert_eq!(run.obs["stdout"], "");
            return;
        }
        if t.kind.base() == Kind::Kube {
            // airlock hands the pinned digest to the cluster, which never runs another
            // image under it: the node cannot pull it, and the kubelet says so. (The node's
            // own digest of the tag is the node's business, not in the message.)
            assert_error(&run, "internal");
            let message = run.obs["error"]["message"].as_str().unwrap();
            assert!(message.contains("ErrImagePull"), "{message}");
            assert!(message.contains(&wrong), "pinned digest missing: {message}");
            assert_eq!(run.obs["stdout"], "");
            return;
        }
        assert_error(&run, "policy_denied");
        let message = run.obs["error"]["message"].as_str().unwrap();
        assert!(message.contains(&wrong), "pinned digest missing: {message}");
        assert!(message.contains(real), "local digest missing: {message}");
        assert_eq!(run.obs["stdout"], "");
    }

    fn the_kernel_is_the_runtimes(t: &Target) {
        let run = t.run(&["-c", "import os; print(os.uname().release)"]);
        assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
        let release = run.obs["stdout"].as_str().unwrap().trim().to_owned();
        let host = rustix::system::uname().release().to_string_lossy().into_owned();
        if t.kind.base() == Kind::Gvisor {
            // gVisor's own kernel answers, not the host's.
            assert_eq!(release, "4.4.0", "gVisor reports 4.4.0");
            assert_ne!(release, host);
        } else {
            assert_eq!(release, host);
        }
    }
}
