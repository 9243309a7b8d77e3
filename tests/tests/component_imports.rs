//! The embedded cache component imports nothing (no WASI, no host
//! functions), so that any component host can load it, and exports exactly
//! the `stile:dedup/cache@0.1.0` interface.

use stile::component::COMPONENT;
use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};

const CACHE_INTERFACE: &str = "stile:dedup/cache@0.1.0";

/// What a walk over the component's sections found.
#[derive(Debug, Default)]
struct Walk {
    /// The outermost component's imports: what a host must supply.
    component_imports: Vec<String>,
    /// Imports of nested components (wit-component wraps the export in one
    /// to ascribe its type); the outer component instantiates them with its
    /// own items, so the host never sees them.
    nested_imports: usize,
    /// The outermost component's exports.
    top_exports: Vec<String>,
    /// Imports of the core modules inside, as `module::name`; these are
    /// satisfied inside the component (canonical built-ins and shims), never
    /// by the host.
    core_imports: Vec<String>,
    core_modules: usize,
    nested_components: usize,
}

fn walk(bytes: &[u8]) -> Walk {
    let mut walk = Walk::default();
    // One entry per open (nested) module or component: whether it is a
    // component. The outermost component is at depth 1.
    let mut stack: Vec<bool> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.expect("the component parses") {
            Payload::Version { encoding, .. } => {
                let component = encoding == Encoding::Component;
                if stack.is_empty() {
                    assert!(component, "the embedded bytes are a component, not a core module");
                } else if component {
                    walk.nested_components += 1;
                } else {
                    walk.core_modules += 1;
                }
                stack.push(component);
            }
            Payload::End(_) => {
                stack.pop().expect("balanced sections");
            }
            Payload::ComponentImportSection(reader) => {
                for import in reader {
                    let name = import.expect("an import parses").name.0.to_owned();
                    if stack.len() == 1 {
                        walk.component_imports.push(name);
                    } else {
                        walk.nested_imports += 1;
                    }
                }
            }
            Payload::ComponentExportSection(reader) if stack.len() == 1 => {
                for export in reader {
                    walk.top_exports.push(export.expect("an export parses").name.0.to_owned());
                }
            }
            Payload::ImportSection(reader) => {
                for import in reader {
                    let import = import.expect("a core import parses");
                    walk.core_imports.push(format!("{}::{}", import.module, import.name));
                }
            }
            _ => {}
        }
    }
    assert!(stack.is_empty(), "the component ends where its bytes end");
    walk
}

#[test]
fn the_component_validates_imports_nothing_and_exports_the_cache() {
    println!("component: {} bytes ({:.1} KiB)", COMPONENT.len(), COMPONENT.len() as f64 / 1024.0);

    // The whole component, nested modules included, is valid.
    Validator::new_with_features(WasmFeatures::all()).validate_all(COMPONENT).expect("the component validates");

    let walk = walk(COMPONENT);
    println!(
        "{} core module(s), {} nested component(s) with {} imports satisfied inside",
        walk.core_modules, walk.nested_components, walk.nested_imports
    );
    println!("core imports, resolved inside the component: {:?}", walk.core_imports);
    println!("exports: {:?}", walk.top_exports);

    assert!(walk.component_imports.is_empty(), "the component imports {:?}", walk.component_imports);
    assert!(walk.core_modules >= 1, "a component with no code");
    assert!(
        walk.core_imports.iter().all(|import| !import.starts_with("wasi")),
        "a core module imports WASI: {:?}",
        walk.core_imports
    );
    assert!(walk.top_exports.iter().any(|name| name == CACHE_INTERFACE), "no {CACHE_INTERFACE} export in {:?}", walk.top_exports);
}

/// The same facts as wasmtime sees them when it compiles the component: an
/// empty linker is enough to instantiate it.
#[test]
fn wasmtime_sees_no_imports() {
    let engine = wasmtime::Engine::default();
    let component = wasmtime::component::Component::new(&engine, COMPONENT).expect("wasmtime compiles the component");
    let ty = component.component_type();
    let imports: Vec<&str> = ty.imports(&engine).map(|(name, _)| name).collect();
    let exports: Vec<&str> = ty.exports(&engine).map(|(name, _)| name).collect();
    assert!(imports.is_empty(), "wasmtime sees imports: {imports:?}");
    assert_eq!(exports, [CACHE_INTERFACE]);
    let linker = wasmtime::component::Linker::<()>::new(&engine);
    let mut store = wasmtime::Store::new(&engine, ());
    linker.instantiate(&mut store, &component).expect("an empty linker instantiates it");
}
