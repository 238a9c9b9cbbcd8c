use super::*;

#[test]
fn a_runtime_dir_needs_both_files_and_the_stdlib_gets_cpythons_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = PythonRuntime::in_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("is not a Python runtime"), "{err}");
    std::fs::write(dir.path().join(MODULE_FILE), b"\0asm\x01\0\0\0").unwrap();
    std::fs::write(dir.path().join(STDLIB_FILE), b"zip").unwrap();
    let rt = PythonRuntime::in_dir(dir.path()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let lib = rt.stdlib_dir(cache.path()).unwrap();
    assert_eq!(std::fs::read(lib.join("python315.zip")).unwrap(), b"zip");
    assert_eq!(rt.stdlib_dir(cache.path()).unwrap(), lib, "made once");

    let script = dir.path().join("analysis.py");
    std::fs::write(&script, "print(1)").unwrap();
    let pj = python_job(&rt, script.to_str().unwrap(), &["x".into()], cache.path()).unwrap();
    assert_eq!(pj.job.invoke.as_deref(), Some("run"));
    assert_eq!(pj.job.args, ["/script/analysis.py", "x"]);
    let guests: Vec<(&str, bool)> = pj
        .job
        .dirs
        .iter()
        .map(|d| (d.guest.as_str(), d.read_only))
        .collect();
    assert_eq!(guests, [("/usr/local/lib", true), ("/script", true)]);
    let copied = pj.job.dirs[1].host.join("analysis.py");
    assert_eq!(
        std::fs::read_to_string(copied).unwrap(),
        "print(1)",
        "only the script is mounted"
    );
    let from_source = python_source_job(&rt, "job.py", b"print(2)", cache.path(), false).unwrap();
    assert_eq!(from_source.job.args, ["/script/job.py"]);
    assert_eq!(
        std::fs::read(from_source.job.dirs[1].host.join("job.py")).unwrap(),
        b"print(2)"
    );
    let stdin = python_job(&rt, "-", &[], cache.path()).unwrap();
    assert_eq!(
        (stdin.job.args.as_slice(), stdin.job.dirs.len()),
        (&["-".to_string()][..], 1)
    );
}

#[test]
fn matplotlibs_data_is_unpacked_once_and_mounted_where_matplotlib_looks() {
    use std::io::Write;
    let zip_of = |files: &[(&str, &[u8])]| {
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (name, bytes) in files {
            w.start_file(*name, opts).unwrap();
            w.write_all(bytes).unwrap();
        }
        w.finish().unwrap().into_inner()
    };
    let inner = zip_of(&[
        ("matplotlibrc", b"backend: Agg\n"),
        ("fonts/ttf/a.ttf", b"font"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(MODULE_FILE), b"\0asm\x01\0\0\0").unwrap();
    std::fs::write(
        dir.path().join(STDLIB_FILE),
        zip_of(&[("os.pyc", b"x"), (MPL_DATA_MEMBER, &inner)]),
    )
    .unwrap();
    let rt = PythonRuntime::in_dir(dir.path()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let plots = b"import matplotlib.pyplot as plt\n";
    let pj = python_source_job(&rt, "job.py", plots, cache.path(), false).unwrap();
    let guests: Vec<&str> = pj.job.dirs.iter().map(|d| d.guest.as_str()).collect();
    assert_eq!(guests, ["/usr/local/lib", MPL_DATA_GUEST, "/script"]);
    let data = &pj.job.dirs[1].host;
    assert!(pj.job.dirs[1].read_only);
    assert_eq!(
        std::fs::read(data.join("matplotlibrc")).unwrap(),
        b"backend: Agg\n"
    );
    assert_eq!(
        std::fs::read(data.join("fonts/ttf/a.ttf")).unwrap(),
        b"font"
    );
    assert!(
        !data.starts_with(&pj.job.dirs[0].host),
        "not inside the stdlib's tree"
    );
    let again = python_source_job(&rt, "job.py", b"df.plot(x='a')", cache.path(), false).unwrap();
    assert_eq!(&again.job.dirs[1].host, data, "unpacked once");
    let plain = python_source_job(&rt, "job.py", b"import numpy", cache.path(), false).unwrap();
    assert_eq!(plain.job.dirs.len(), 2, "no plotting, no matplotlib data");
    let told = python_source_job(&rt, "job.py", b"import mylib", cache.path(), true).unwrap();
    assert_eq!(
        told.job.dirs[1].guest, MPL_DATA_GUEST,
        "code it imports plots"
    );
    let stdin = python_job(&rt, "-", &[], cache.path()).unwrap();
    assert_eq!(
        stdin.job.dirs[1].guest, MPL_DATA_GUEST,
        "a program unseen may plot"
    );
}

/// A runtime whose stdlib is `dir/python-stdlib.zip` holding `text`.
fn runtime_in(dir: &Path, text: &str) -> PythonRuntime {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(MODULE_FILE), b"\0asm\x01\0\0\0").unwrap();
    std::fs::write(dir.join(STDLIB_FILE), text).unwrap();
    PythonRuntime::in_dir(dir).unwrap()
}

/// Makes `dir` look unused for two days.
fn age(dir: &Path) {
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 24 * 3600);
    let record = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(SOURCE_RECORD))
        .unwrap();
    record.set_modified(two_days_ago).unwrap();
}

#[test]
fn stdlib_dirs_whose_source_changed_or_went_are_removed_once_unused_and_no_others() {
    let (venvs, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let current = runtime_in(&venvs.path().join("current"), "current");
    let current_dir = current.stdlib_dir(cache.path()).unwrap();
    age(&current_dir);
    let deleted = runtime_in(&venvs.path().join("deleted"), "deleted");
    let deleted_dir = deleted.stdlib_dir(cache.path()).unwrap();
    age(&deleted_dir);
    let just_used = runtime_in(&venvs.path().join("just-used"), "just used");
    let just_used_dir = just_used.stdlib_dir(cache.path()).unwrap();
    let upgraded = runtime_in(&venvs.path().join("upgraded"), "0.1.0");
    let upgraded_dir = upgraded.stdlib_dir(cache.path()).unwrap();
    age(&upgraded_dir);
    std::fs::remove_dir_all(venvs.path().join("deleted")).unwrap();
    std::fs::remove_dir_all(venvs.path().join("just-used")).unwrap();
    // pip replaces the file: a new inode at the same path.
    let zip = venvs.path().join("upgraded").join(STDLIB_FILE);
    std::fs::remove_file(&zip).unwrap();
    std::fs::write(&zip, "0.1.1").unwrap();

    let new_dir = upgraded.stdlib_dir(cache.path()).unwrap();
    assert_ne!(
        new_dir, upgraded_dir,
        "a changed stdlib gets a dir of its own"
    );
    assert_eq!(
        std::fs::read(new_dir.join("python315.zip")).unwrap(),
        b"0.1.1"
    );
    assert!(
        !deleted_dir.exists(),
        "its venv is gone and nothing used it for two days"
    );
    assert!(
        !upgraded_dir.exists(),
        "its file was replaced and nothing used it for two days"
    );
    assert!(
        current_dir.exists(),
        "its file is still there as it was: kept however old"
    );
    assert!(
        just_used_dir.exists(),
        "its file is gone, but a job may still be importing from it"
    );

    // A dir is marked used each time it is asked for, so a dir in use is never old.
    age(&current_dir);
    assert_eq!(current.stdlib_dir(cache.path()).unwrap(), current_dir);
    let age_now = std::fs::metadata(current_dir.join(SOURCE_RECORD))
        .unwrap()
        .modified()
        .unwrap()
        .elapsed()
        .unwrap();
    assert!(age_now < std::time::Duration::from_secs(60), "{age_now:?}");
}
