import torch
from transformers import AutoConfig, AutoModelForCausalLM


class Model(torch.nn.Module):
    def __init__(self, model_name, config):
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(model_name, config=config)

    def forward(self, x):
        return self.model(x).logits


model_name = "gpt2"
config = AutoConfig.from_pretrained(model_name)


def get_inputs():
    return [torch.randint(0, config.vocab_size, (2, 16))]


def get_init_inputs():
    return [model_name, config]
