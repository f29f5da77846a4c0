//! Evaluating DeviceClass and request CEL selectors on devices through `tessera-cel`.
//!
//! Expressions are compiled once per inventory; each device gets one CEL context, built on first
//! use and reused by every selector; a class's verdict on a device is cached in the inventory (it
//! cannot change while the inventory lives), a request's verdict per allocation run.
//!
//! A selector that does not compile fails only when it is evaluated, as upstream (which compiles
//! on first use) fails: selectors are evaluated in order and stop at the first that is false, so
//! a broken second selector fails only the devices the first one matches.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector};
use tessera_cel::{DeviceContext, Selector, SelectorCompiler};

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

/// Compiled selectors, shared by all allocations on one inventory.
#[derive(Default)]
pub(crate) struct SelectorCache {
    compiler: SelectorCompiler,
    compiled: RwLock<HashMap<String, Result<Arc<Selector>, String>>>,
    contexts: OnceLock<Vec<OnceLock<DeviceContext>>>,
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
        let result = self.compiler.compile(expression).map_err(|e| e.to_string());
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
        let contexts = self
            .contexts
            .get_or_init(|| (0..devices.len()).map(|_| OnceLock::new()).collect());
        let entry = &devices[index];
        let context =
            contexts[index].get_or_init(|| DeviceContext::new(entry.id.driver(), &entry.device));
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
            match selector.evaluate(context) {
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
