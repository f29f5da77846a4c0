//! `tessera schema`: the device attributes and capacities a selector can use.

use std::io::Write;

use tessera_api::schema::{ATTRIBUTES, AttributeKind, CAPACITIES, Carriers, split_qualified};

#[derive(Debug, clap::Args)]
pub struct SchemaArgs {
    /// `table` for a terminal; `markdown` for the tables of docs/attributes.md.
    #[arg(long, value_enum, default_value_t = SchemaFormat::Table)]
    pub format: SchemaFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaFormat {
    Table,
    Markdown,
}

fn carriers(c: Carriers) -> &'static str {
    match c {
        Carriers::All => "gpu, mig",
        Carriers::Gpu => "gpu",
        Carriers::Mig => "mig",
    }
}

fn kind(k: AttributeKind) -> &'static str {
    match k {
        AttributeKind::Int => "int",
        AttributeKind::Bool => "bool",
        AttributeKind::String => "string",
        AttributeKind::Version => "version",
    }
}

fn meaning(spec: &tessera_api::schema::AttributeSpec) -> String {
    if spec.optional {
        format!("{} (only where the hardware has it)", spec.meaning)
    } else {
        spec.meaning.to_owned()
    }
}

/// Writes one table row per attribute and capacity, with the CEL expression that reads it.
pub fn run(args: &SchemaArgs, out: &mut impl Write) -> anyhow::Result<()> {
    match args.format {
        SchemaFormat::Table => table(out),
        SchemaFormat::Markdown => markdown(out),
    }
}

/// The two Markdown tables docs/attributes.md carries (a test keeps them equal to this output).
fn markdown(out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(out, "| Attribute | Type | On | CEL | Meaning |")?;
    writeln!(out, "|---|---|---|---|---|")?;
    for spec in ATTRIBUTES {
        let (domain, id) = split_qualified(spec.name);
        writeln!(
            out,
            "| `{}` | {} | {} | `device.attributes[\"{domain}\"].{id}` | {} |",
            spec.name,
            kind(spec.kind),
            carriers(spec.carriers),
            meaning(spec).replace('|', "\\|")
        )?;
    }
    writeln!(out)?;
    writeln!(out, "| Capacity | On | CEL | Meaning |")?;
    writeln!(out, "|---|---|---|---|")?;
    for spec in CAPACITIES {
        let (domain, id) = split_qualified(spec.name);
        writeln!(
            out,
            "| `{}` | {} | `device.capacity[\"{domain}\"].{id}` | {} |",
            spec.name,
            carriers(spec.carriers),
            spec.meaning.replace('|', "\\|")
        )?;
    }
    Ok(())
}

fn table(out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<28} {:<9} {:<9} {:<58} MEANING",
        "NAME", "KIND", "ON", "CEL"
    )?;
    for spec in ATTRIBUTES {
        let (domain, id) = split_qualified(spec.name);
        let cel = format!("device.attributes[\"{domain}\"].{id}");
        let meaning = meaning(spec);
        writeln!(
            out,
            "{:<28} {:<9} {:<9} {cel:<58} {meaning}",
            spec.name,
            kind(spec.kind),
            carriers(spec.carriers)
        )?;
    }
    for spec in CAPACITIES {
        let (domain, id) = split_qualified(spec.name);
        let cel = format!("device.capacity[\"{domain}\"].{id}");
        writeln!(
            out,
            "{:<28} {:<9} {:<9} {cel:<58} {}",
            spec.name,
            "quantity",
            carriers(spec.carriers),
            spec.meaning
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_row_with_its_cel_path() {
        let mut out = Vec::new();
        run(
            &SchemaArgs {
                format: SchemaFormat::Table,
            },
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().count(),
            1 + ATTRIBUTES.len() + CAPACITIES.len()
        );
        assert!(text.contains(r#"device.attributes["gpu.tessera.dev"].productName"#));
        assert!(text.contains(r#"device.attributes["resource.kubernetes.io"].pcieRoot"#));
        assert!(text.contains(r#"device.capacity["gpu.tessera.dev"].memory"#));
    }
}
