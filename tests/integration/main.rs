
mod golden_support;
mod oracle;
mod golden_cox;
