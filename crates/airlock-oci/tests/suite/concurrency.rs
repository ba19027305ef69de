//! Many jobs asking for the same image at once: one unpack, no torn reads.

use std::sync::{Arc, Barrier};

use super::common::{Area, TarBuilder, airlock_bin, make_image, skip_or_fail};

const FILES: usize = 300;

fn image_tar() -> Vec<u8> {
    let mut tar = TarBuilder::new().dir("data", 0o755);
    for i in 0..FILES {
        tar = tar.file(
            &format!("data/f{i:04}"),
            0o644,
            format!("content {i}\n").repeat(50).as_bytes(),
        );
    }
    tar.finish()
}

fn check_tree(root: &std::path::Path) {
    for i in 0..FILES {
        let text = std::fs::read_to_string(root.join(format!("data/f{i:04}"))).unwrap();
        assert_eq!(
            text,
            format!("content {i}\n").repeat(50),
            "torn read of f{i:04}"
        );
    }
}

#[test]
fn concurrent_threads_unpack_once_and_never_see_a_partial_tree() {
    let area = Area::new();
    let store = area.store();
    let record = make_image(&store, &[image_tar()]).unwrap();
    // Drop the cache so the threads race for it.
    airlock_oci::unpack::remove_tree(&store.rootfs_path(&record.id)).unwrap();
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let id = record.id.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let (root, unpacked) = store.rootfs(&id).unwrap();
                check_tree(&root);
                unpacked
            })
        })
        .collect();
    let unpacks = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|u| *u)
        .count();
    assert_eq!(unpacks, 1, "exactly one unpack");
    assert_eq!(
        std::fs::read_dir(store.tmp_dir()).unwrap().count(),
        0,
        "staging left behind"
    );
}

#[test]
fn concurrent_processes_unpack_once() {
    let bin = airlock_bin();
    if !bin.is_file() {
        return skip_or_fail(&format!(
            "no airlock binary at {} (cargo build -p airlock-cli)",
            bin.display()
        ));
    }
    let area = Area::new();
    let store = area.store();
    let record = make_image(&store, &[image_tar()]).unwrap();
    airlock_oci::unpack::remove_tree(&store.rootfs_path(&record.id)).unwrap();
    let children: Vec<_> = (0..6)
        .map(|_| {
            std::process::Command::new(&bin)
                .args(["image", "--store"])
                .arg(store.root())
                .args(["prepare", record.id.as_str()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut unpacked = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        if text.starts_with("unpacked ") {
            unpacked += 1;
        } else {
            assert!(text.starts_with("ready "), "{text}");
        }
        let path = text.split_whitespace().nth(1).unwrap();
        check_tree(std::path::Path::new(path));
    }
    assert_eq!(unpacked, 1, "exactly one process unpacked");
}
