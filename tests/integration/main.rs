mod golden_cox;
mod golden_fine_gray;
mod golden_support;
mod oracle;
