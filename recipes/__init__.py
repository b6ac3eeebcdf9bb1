"""gbmw's bundled recipes (package data, installed as `gbmw.recipes`): model architectures, clusters, jobs that
pair them, published hand-tuned configurations and the GPT-3 recipes. Data only; gbmw.specs.bundled finds them."""
