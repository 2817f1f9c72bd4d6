"""Unconditional DDPM training in the style of diffusers' examples/unconditional_image_generation
/train_unconditional.py (Accelerate, UNet2DModel, DDPMScheduler), cut to what runs on a CPU: a
tiny UNet and a generated image set in place of a downloaded one."""

import argparse
import math
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from torch.utils.data import Dataset


def parse_args():
    parser = argparse.ArgumentParser(description="Simple example of a training script.")
    parser.add_argument("--output_dir", type=str, default="ddpm-model-32")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--num_images", type=int, default=2048)
    parser.add_argument("--train_batch_size", type=int, default=16)
    parser.add_argument("--dataloader_num_workers", type=int, default=0)
    parser.add_argument("--num_epochs", type=int, default=100)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--lr_scheduler", type=str, default="cosine")
    parser.add_argument("--lr_warmup_steps", type=int, default=50)
    parser.add_argument("--adam_beta1", type=float, default=0.95)
    parser.add_argument("--adam_beta2", type=float, default=0.999)
    parser.add_argument("--adam_weight_decay", type=float, default=1e-6)
    parser.add_argument("--adam_epsilon", type=float, default=1e-08)
    parser.add_argument("--mixed_precision", type=str, default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--ddpm_num_steps", type=int, default=1000)
    parser.add_argument("--ddpm_beta_schedule", type=str, default="linear")
    parser.add_argument("--save_model_epochs", type=int, default=10)
    return parser.parse_args()


class GeneratedImages(Dataset):
    """Smooth random images in [-1, 1], each decoded from a seed as a real set would be read
    and augmented."""

    def __init__(self, count, resolution):
        self.count, self.resolution = count, resolution

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        low = torch.rand(3, 4, 4, generator=g)
        image = F.interpolate(low[None], size=self.resolution, mode="bilinear")[0]
        if torch.rand(1, generator=g).item() < 0.5:
            image = image.flip(-1)
        return {"input": image * 2 - 1}


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision=args.mixed_precision)
    model = UNet2DModel(
        sample_size=args.resolution,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    )
    noise_scheduler = DDPMScheduler(num_train_timesteps=args.ddpm_num_steps,
                                    beta_schedule=args.ddpm_beta_schedule)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate,
                                  betas=(args.adam_beta1, args.adam_beta2),
                                  weight_decay=args.adam_weight_decay, eps=args.adam_epsilon)
    dataset = GeneratedImages(args.num_images, args.resolution)
    train_dataloader = torch.utils.data.DataLoader(
        dataset, batch_size=args.train_batch_size, shuffle=True,
        num_workers=args.dataloader_num_workers)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    warmup = args.lr_warmup_steps * args.gradient_accumulation_steps
    lr_scheduler = get_scheduler(args.lr_scheduler, optimizer=optimizer, num_warmup_steps=warmup,
                                 num_training_steps=num_update_steps_per_epoch * args.num_epochs)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)

    global_step = 0
    for epoch in range(args.num_epochs):
        model.train()
        for batch in train_dataloader:
            clean_images = batch["input"]
            noise = torch.randn(clean_images.shape, device=clean_images.device)
            bsz = clean_images.shape[0]
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,),
                                      device=clean_images.device).long()
            noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
            with accelerator.accumulate(model):
                model_output = model(noisy_images, timesteps).sample
                loss = F.mse_loss(model_output.float(), noise.float())
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                global_step += 1
            if global_step % 50 == 0:
                print(f"epoch {epoch} step {global_step} loss {loss.detach().item():.4f}")
        if accelerator.is_main_process and (epoch + 1) % args.save_model_epochs == 0:
            os.makedirs(args.output_dir, exist_ok=True)
            accelerator.unwrap_model(model).save_pretrained(os.path.join(args.output_dir, "unet"))
    accelerator.end_training()


if __name__ == "__main__":
    main()
