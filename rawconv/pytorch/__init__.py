"""rawconv in PyTorch's terms: the custom operators, nn modules, convert/describe, torch_choice,
torch_flags, distributed tuning. Reaches the backends through their packages and the registry."""
