"""finetune: fine-tune BERT text classifiers and ViT image classifiers with Accelerate.

accelerate launch finetune/run.py                                  # the default recipe
accelerate launch finetune/run.py --config finetune/configs/vit_fashion_mnist.yaml
accelerate launch finetune/evaluate_checkpoint.py runs/bert-rotten-tomatoes/model
"""

__version__ = "0.1.0"
