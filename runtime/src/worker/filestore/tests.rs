use super::*;
use crate::proto::tree::{EntryKind, TreeEntry};

fn put(store: &Arc<FileStore>, tenant: &str, bytes: &[u8]) -> Result<FileHash, StoreError> {
    let hash = FileHash::of(bytes);
    let mut incoming = store.receive(hash)?;
    incoming.write(bytes)?;
    incoming.finish(tenant)?;
    Ok(hash)
}

fn tree_of(files: &[&[u8]]) -> (ModuleHash, Manifest) {
    let entries = files
        .iter()
        .enumerate()
        .map(|(i, b)| TreeEntry {
            path: format!("f{i}"),
            kind: EntryKind::File {
                hash: FileHash::of(b),
                size: b.len() as u64,
            },
        })
        .collect();
    let m = Manifest { entries };
    (m.hash(), m)
}

#[test]
fn files_are_kept_by_hash_and_the_least_recently_used_go_unless_pinned() {
    // Each file takes its 1000 bytes and a block and an inode.
    let cost = 1000 + NEW_INODE_BYTES;
    let disk = Arc::new(ScratchPool::new(10 * cost));
    let store = Arc::new(FileStore::new(None, 3 * cost, Some(disk.clone()), false).unwrap());
    let (a, b, c) = (vec![1u8; 1000], vec![2u8; 1000], vec![3u8; 1000]);
    let (tree, manifest) = tree_of(&[&a]);
    assert_eq!(
        store.put_manifest("t", tree, manifest).unwrap(),
        vec![FileHash::of(&a)]
    );
    put(&store, "t", &a).unwrap();
    let grant = TreeGrant {
        manifest: tree,
        guest: "/d".into(),
        read_only: true,
    };
    let pins = store.pin_trees("t", std::slice::from_ref(&grant)).unwrap();
    put(&store, "t", &b).unwrap();
    put(&store, "t", &c).unwrap();
    put(&store, "t", &[4u8; 1000]).unwrap(); // over budget: b goes, a is pinned
    assert!(store.has_file("t", &FileHash::of(&a)) && !store.has_file("t", &FileHash::of(&b)));
    assert_eq!((store.held(), disk.in_use()), (3 * cost, 3 * cost));
    assert_eq!(std::fs::read(store.path_of(&FileHash::of(&a))).unwrap(), a);
    drop(pins);
    put(&store, "t", &[5u8; 1000]).unwrap();
    assert!(
        !store.has_file("t", &FileHash::of(&a)),
        "unpinned, the least recently used goes"
    );
    assert!(
        store
            .pin_trees("t", &[grant])
            .unwrap_err()
            .contains("is not here")
    );
}

#[test]
fn bytes_that_do_not_match_their_name_are_not_kept_and_their_disk_is_given_back() {
    let disk = Arc::new(ScratchPool::new(10_000));
    let store = Arc::new(FileStore::new(None, 5000, Some(disk.clone()), false).unwrap());
    let mut incoming = store.receive(FileHash::of(b"what was promised")).unwrap();
    incoming.write(b"something else").unwrap();
    assert!(matches!(incoming.finish("t"), Err(StoreError::Invalid(_))));
    assert_eq!((store.held(), disk.in_use()), (0, 0));
    let mut big = store.receive(FileHash::of(b"x")).unwrap();
    assert!(matches!(
        big.write(&[0u8; 6000]),
        Err(StoreError::TooLarge(_))
    ));
}

#[test]
fn with_tenants_a_file_is_usable_only_by_those_who_sent_it() {
    let store = Arc::new(FileStore::new(None, 5000, None, true).unwrap());
    let data = b"alice's data";
    let (tree, manifest) = tree_of(&[data]);
    store.put_manifest("alice", tree, manifest.clone()).unwrap();
    put(&store, "alice", data).unwrap();
    let grant = TreeGrant {
        manifest: tree,
        guest: "/d".into(),
        read_only: true,
    };
    assert!(
        store
            .pin_trees("alice", std::slice::from_ref(&grant))
            .is_ok()
    );
    assert!(
        store
            .pin_trees("bob", std::slice::from_ref(&grant))
            .unwrap_err()
            .contains("not sent by you")
    );
    // Bob knows the hashes; he must still send the bytes.
    assert_eq!(
        store.put_manifest("bob", tree, manifest).unwrap(),
        vec![FileHash::of(data)]
    );
    assert!(
        store
            .pin_trees("bob", std::slice::from_ref(&grant))
            .unwrap_err()
            .contains("is not here")
    );
    put(&store, "bob", data).unwrap();
    assert!(store.pin_trees("bob", &[grant]).is_ok());
}
