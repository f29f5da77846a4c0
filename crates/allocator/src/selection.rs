//! Evaluating DeviceClass and request CEL selectors on devices through `tessera-cel`.
//!
//! Expressions are compiled once per process (a compiler shared by every inventory, as
//! kube-scheduler shares its compiler cache, so rebuilding an inventory compiles nothing again).
//! Selectors that read the device only through one-step names (`device.driver`,
//! `device.attributes["<domain>"].<id>`: most class and request selectors) are evaluated on a
//! `DeviceView` of the published object, which converts only the values they look up; the
//! device's values are checked once (`invalid`, cached per device). Other selectors get the
//! device's full CEL context, built on first need and then used for every selector on that
//! device. A class's verdict on a device is cached in the inventory (it cannot change while the
//! inventory lives), a request's verdict per allocation run.
//!
//! A selector that does not compile fails only when it is evaluated, as upstream (which compiles
//! on first use) fails: selectors are evaluated in order and stop at the first that is false, so
//! a broken second selector fails only the devices the first one matches.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock, RwLock};

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector};
use tessera_cel::{DeviceContext, DeviceView, EvalError, Selector, SelectorCompiler};

use crate::device::DeviceEntry;

/// The outcome of a list of selectors (all must be true) on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Match,
    /// The first selector that evaluated to false.
    NoMatch(usize),
    /// A selector failed: it does not compile (`compile`), or it failed at run time.
    Failed {
        selector: usize,
        message: String,
        compile: bool,
    },
}

/// A selector list with a selector of an unknown type (no `cel` field): selector `index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EmptySelector {
    pub index: usize,
}

/// One compiled selector, or why it does not compile.
pub(crate) type Compiled = Result<Arc<Selector>, String>;

/// The compiler every inventory of the process shares (it caches by expression, errors too).
static COMPILER: LazyLock<SelectorCompiler> = LazyLock::new(SelectorCompiler::new);

/// Compiled selectors, shared by all allocations on one inventory.
#[derive(Default)]
pub(crate) struct SelectorCache {
    compiled: RwLock<HashMap<String, Result<Arc<Selector>, String>>>,
    devices: OnceLock<Vec<DeviceCel>>,
}

/// What the selectors of one device need, each part made on first need.
#[derive(Default)]
struct DeviceCel {
    /// Why every selector fails on the device (a value CEL cannot represent), if one does.
    invalid: OnceLock<Option<EvalError>>,
    /// The full `device` variable, for selectors that read its maps as a whole.
    context: OnceLock<DeviceContext>,
}

impl std::fmt::Debug for SelectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectorCache").finish_non_exhaustive()
    }
}

impl SelectorCache {
    fn compile_one(&self, expression: &str) -> Result<Arc<Selector>, String> {
        if let Some(done) = self
            .compiled
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(expression)
        {
            return done.clone();
        }
        let result = COMPILER.compile(expression).map_err(|e| e.to_string());
        self.compiled
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(expression.to_owned(), result.clone());
        result
    }

    /// Compiles a selector list (class or request); a selector that does not compile is kept as
    /// its error, to fail when evaluated.
    pub fn compile(&self, selectors: &[DeviceSelector]) -> Result<Vec<Compiled>, EmptySelector> {
        selectors
            .iter()
            .enumerate()
            .map(|(index, s)| {
                let cel = s.cel.as_ref().ok_or(EmptySelector { index })?;
                Ok(self.compile_one(&cel.expression))
            })
            .collect()
    }

    /// Evaluates compiled selectors on a device; `index` is the device's inventory index.
    pub fn evaluate(
        &self,
        selectors: &[Compiled],
        devices: &[DeviceEntry],
        index: usize,
    ) -> Verdict {
        if selectors.is_empty() {
            return Verdict::Match;
        }
        let cel = &self
            .devices
            .get_or_init(|| devices.iter().map(|_| DeviceCel::default()).collect())[index];
        let entry = &devices[index];
        let driver = entry.id.driver();
        // A selector that does not compile fails without looking at the device.
        let by_paths = selectors
            .iter()
            .all(|s| s.as_ref().map_or(true, |s| s.reads_paths_only()));
        match cel.context.get() {
            None if by_paths => {
                let invalid = cel
                    .invalid
                    .get_or_init(|| DeviceView::new(driver, &entry.device).invalid().cloned());
                let view = DeviceView::checked(driver, &entry.device, invalid.clone());
                evaluate_each(selectors, |s| s.evaluate_view(&view))
            }
            context => {
                let context = context.unwrap_or_else(|| {
                    cel.context
                        .get_or_init(|| DeviceContext::new(driver, &entry.device))
                });
                evaluate_each(selectors, |s| s.evaluate(context))
            }
        }
    }
}

/// Selectors in order, stopping at the first that is false or fails.
fn evaluate_each(
    selectors: &[Compiled],
    evaluate: impl Fn(&Selector) -> Result<bool, EvalError>,
) -> Verdict {
    for (i, selector) in selectors.iter().enumerate() {
        let selector = match selector {
            Ok(s) => s,
            Err(message) => {
                return Verdict::Failed {
                    selector: i,
                    message: message.clone(),
                    compile: true,
                };
            }
        };
        match evaluate(selector) {
            Ok(true) => {}
            Ok(false) => return Verdict::NoMatch(i),
            Err(e) => {
                return Verdict::Failed {
                    selector: i,
                    message: e.to_string(),
                    compile: false,
                };
            }
        }
    }
    Verdict::Match
}

/// A DeviceClass with its compiled selectors and per-device verdicts.
pub(crate) struct ClassEntry {
    pub class: DeviceClass,
    compiled: OnceLock<Result<Vec<Compiled>, EmptySelector>>,
    verdicts: Vec<OnceLock<Verdict>>,
}

impl std::fmt::Debug for ClassEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassEntry")
            .field("name", &self.class.metadata.name)
            .finish_non_exhaustive()
    }
}

impl ClassEntry {
    pub fn new(class: DeviceClass, device_count: usize) -> ClassEntry {
        ClassEntry {
            class,
            compiled: OnceLock::new(),
            verdicts: (0..device_count).map(|_| OnceLock::new()).collect(),
        }
    }

    pub fn name(&self) -> &str {
        self.class.metadata.name.as_deref().unwrap_or_default()
    }

    /// The compiled class selectors.
    pub fn selectors(&self, cache: &SelectorCache) -> Result<&[Compiled], EmptySelector> {
        self.compiled
            .get_or_init(|| {
                cache.compile(
                    self.class
                        .spec
                        .as_ref()
                        .and_then(|s| s.selectors.as_deref())
                        .unwrap_or_default(),
                )
            })
            .as_ref()
            .map(Vec::as_slice)
            .map_err(Clone::clone)
    }

    /// The class's verdict on a device (cached). A selector of unknown type makes every verdict a
    /// failure of that selector.
    pub fn verdict(&self, cache: &SelectorCache, devices: &[DeviceEntry], index: usize) -> Verdict {
        self.verdicts[index]
            .get_or_init(|| match self.selectors(cache) {
                Ok(selectors) => cache.evaluate(selectors, devices, index),
                Err(EmptySelector { index }) => Verdict::Failed {
                    selector: index,
                    message: "CEL expression empty (unsupported selector type?)".into(),
                    compile: true,
                },
            })
            .clone()
    }
}
