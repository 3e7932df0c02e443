//! The option documents are generated from one table (`epifusion::options::FIT_OPTIONS`): the
//! README's and `pipelines/README.md`'s blocks between `<!-- fit-options:begin -->` and
//! `<!-- fit-options:end -->` must equal it. `EPIFUSION_WRITE_DOCS=1 cargo test --test
//! integration docs` rewrites them.

use epifusion::options::options_markdown;

const BEGIN: &str = "<!-- fit-options:begin -->\n";
const END: &str = "<!-- fit-options:end -->";

fn check(relative: &str) {
    let path = format!("{}/{relative}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{relative}: no {BEGIN}"))
        + BEGIN.len();
    let end = start
        + text[start..]
            .find(END)
            .unwrap_or_else(|| panic!("{relative}: no {END}"));
    let want = options_markdown();
    if std::env::var_os("EPIFUSION_WRITE_DOCS").is_some() && text[start..end] != want {
        std::fs::write(&path, format!("{}{want}{}", &text[..start], &text[end..])).unwrap();
        return;
    }
    assert_eq!(
        &text[start..end],
        want,
        "{relative}: the fit-options block drifted from FIT_OPTIONS; regenerate it with \
         `EPIFUSION_WRITE_DOCS=1 cargo test --test integration docs`"
    );
}

#[test]
fn readme_options_table_is_generated() {
    check("README.md");
}

#[test]
fn pipelines_readme_options_table_is_generated() {
    check("pipelines/README.md");
}

/// The SQL documentation (`epifusion_functions()`) lists every option key.
#[test]
fn sql_function_docs_list_every_option() {
    let text = epifusion::engine::docs::options_documentation();
    for d in epifusion::options::FIT_OPTIONS {
        assert!(text.contains(&format!("`{}`", d.key)), "{} missing", d.key);
    }
}
